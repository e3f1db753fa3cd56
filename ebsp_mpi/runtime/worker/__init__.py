"""A worker: its loop (pull, compute, push), its wires (dense chunks, sufficient factors), OSDP's
on-demand layers, and what it measures (peak memory, iteration times)."""
