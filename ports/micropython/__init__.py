# The MicroPython port of the gateway (ESP32 / Pico W): gateway.py (TCP server, main loop,
# Wi-Fi, flags) and link.py (UDP and UART transports for the link to the companion).
