"""Developer tools: ``tools/demo.py`` (``make demo``) and ``tools/ros_observer.py``."""
