"""The OpenAI-compatible HTTP gateway: validates, templates and tokenizes, routes, streams tokens back."""
