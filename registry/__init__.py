"""The agentrt registry: immutable, content-addressed agent definitions and their components."""
