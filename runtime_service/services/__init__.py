"""The runtime's use cases (threads, runs, leases), over storage, without transport."""
