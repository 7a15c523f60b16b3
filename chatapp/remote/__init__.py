"""`--backend URL`: the faces chat through any OpenAI-compatible server (docs/serve.md)."""
