"""aider run non-interactively against an OpenAI-compatible server, as scripts/clients-check.py's
aider rows and scripts/aider-bench.py both run it (standard library only).

`command(aider, base, edit_format, extra)`: aider's argument list (model `openai/m` at
`base`/v1, the edit format, no git, no repository map, no streaming, no prompts to answer) with
`extra` after it (`--timeout`, then `--message TEXT FILE` or `--exit`); `env(base)`: the environment it runs in.
"""
import os


def command(aider, base, edit_format, extra):
    return [aider, "--model", "openai/m", "--openai-api-base", base + "/v1", "--openai-api-key", "unused",
            "--edit-format", edit_format, "--yes-always", "--no-git", "--no-auto-commits", "--map-tokens", "0",
            "--no-show-model-warnings", "--no-check-update", "--no-analytics", "--no-pretty", "--no-stream"] + extra


def env(base):
    return dict(os.environ, OPENAI_API_KEY="unused", OPENAI_API_BASE=base + "/v1", AIDER_ANALYTICS="false")
