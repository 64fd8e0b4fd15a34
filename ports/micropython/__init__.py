# The MicroPython port of the gateway (ESP32 / Pico W), laid out like the CPython side:
# gateway.py (the program: options, Wi-Fi, start-up), loop.py (the poll loop over the listener,
# the clients and the link; the clock) and link.py (UDP and UART transports, the link driver).
