"""The field impairments of the end-to-end tests: a real-time UDP impairment proxy (loss,
duplication, reordering within a depth, delay, blackouts) and a paced serial line with bit errors.
They live in tools/impair.py, shared with bench/link_field.py (benches import nothing from tests/);
the virtual-clock proxies of the link tests are tests/link/helpers.py's UdpProxy and SerialProxy."""

from tools.impair import BerLine, Impairment, UdpImpairProxy, geometric_gap

__all__ = ["BerLine", "Impairment", "UdpImpairProxy", "geometric_gap"]
