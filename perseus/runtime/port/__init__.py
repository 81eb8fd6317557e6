"""The runtime's view of one GPU: the device, its clock controller and energy poller behind one
port, clock notices as events, and the optional per-instruction clock trace."""
