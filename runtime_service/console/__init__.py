"""The web console (``agentrt serve --console-listen``): pages for operators and auditors,
served by the server's process and made only of the server's own API calls, as the
signed-in principal (docs/console.md, docs/architecture.md)."""
