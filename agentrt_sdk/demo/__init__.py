"""``agentrt demo``: the design notes' login-fix case, played with real worker processes."""
