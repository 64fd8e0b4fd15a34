import threading


class SingleThreadedExecutor:
    def __init__(self):
        self._nodes = []
        self._wake = threading.Event()
        self._stop = False

    def add_node(self, node):
        self._nodes.append(node)
        node._executor = self

    def spin(self):
        while not self._stop:
            self._wake.wait(0.5)
            self._wake.clear()
            for n in self._nodes:
                for g in list(n.guards):
                    if g.triggered:
                        g.triggered = False
                        g.callback()

    def shutdown(self):
        self._stop = True
        self._wake.set()
