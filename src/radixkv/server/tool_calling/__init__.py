"""Tool calling on the chat API: the request's tools and `tool_choice`, the parsers
that read a model's tool calls, and their streamed deltas."""
