# The board's serial link transport: a machine.UART (ports/micropython/link.py has the UDP one
# and the driver). Imported by build.py only for a uart: link, so a board on UDP never loads it.
import ubrb_min as L


class UartTransport:
    datagram = False

    def __init__(self, machine_mod, uart_id, baud, max_frame, tx=None, rx=None):
        pace = baud // 10
        kw = {
            "baudrate": baud,
            "timeout": 0,
            "timeout_char": 0,
            # the driver's rings: rx holds ~100 ms of line time (the loop polls every <= 50 ms),
            # tx holds what the pacing lets out at once (its credit plus one frame)
            "rxbuf": max(1024, min(8192, pace // 10)),
            "txbuf": min(8192, pace * L.LINK_PACE_MS // 1000 + max_frame + 64),
        }
        if tx is not None:
            kw["tx"] = tx
        if rx is not None:
            kw["rx"] = rx
        self.uart = machine_mod.UART(uart_id, **kw)
        self.stream = self.uart
        self.baud = baud
        self.where = "uart:%d" % uart_id
        self.c_io_err = 0

    def readinto(self, buf):
        n = self.uart.readinto(buf)
        return n or 0  # None: nothing within timeout=0

    def write(self, buf, off, n):
        k = self.uart.write(buf, off, n)
        return k or 0

    def close(self):
        try:
            self.uart.deinit()
        except AttributeError:
            pass
