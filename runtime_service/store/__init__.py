"""The runtime's tables and queries."""
