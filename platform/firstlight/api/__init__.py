"""The OpenAI-compatible HTTP API: schemas, prompt encoding, responses and the gateway."""
