"""What moves the messages, for servers and workers alike: the protocol (tags, headers, orders), the
layout of a run's messages, the wire's part kinds, OSDP's fetches, the process context, waiting by
polling, deadlines, keep-alives and the shared clock. Decides nothing about training."""
