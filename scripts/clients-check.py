#!/usr/bin/env python3
"""Real OpenAI-compatible clients, unmodified, against a running `treespec serve` (issue #65).

Each row drives one client the way its users do and checks what came back; the table says
pass/fail per row (and why), and the exit code is 1 if any row failed.

  openai     the `openai` Python client: a chat whole and streamed (with usage), a required tool
             call, a `json_schema` response, logprobs
  instructor `instructor`: a Pydantic model out of a chat, in JSON-schema and in tools mode
  langchain  `langchain-openai`: `bind_tools`, then a tool round trip (the tool's result back)
  llm        Simon Willison's `llm` CLI with the server as an OpenAI-compatible model in its config
  aider-whole, aider-diff, aider-udiff
             `aider` (its own virtual environment: $AIDER names its executable) asked for one edit
             of a small Python file in each edit format, non-interactively; the row passes when the
             edit was applied and the file's checks pass. They need a model that follows aider's
             formats (the Qwen 1.5B target), not SmolLM2

Usage: clients-check.py BASE_URL [--rows openai,instructor,...]   (BASE_URL like http://127.0.0.1:8080;
default rows: the first four)
scripts/clients-check.sh installs the clients into a virtual environment and starts the server.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import aider_run  # noqa: E402

ASK = [{"role": "user", "content": "Name three colours."}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def row_openai(base):
    from openai import OpenAI

    client = OpenAI(base_url=base + "/v1", api_key="unused")
    whole = client.chat.completions.create(model="m", messages=ASK, max_tokens=16, temperature=0)
    text = whole.choices[0].message.content
    assert text and whole.usage.completion_tokens > 0, whole
    chunks = list(client.chat.completions.create(model="m", messages=ASK, max_tokens=16, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text, (streamed, text)
    assert chunks[-1].usage and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens, chunks[-1]
    call = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER], tool_choice="required", max_tokens=48, temperature=0)
    calls = call.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_weather", call
    assert isinstance(json.loads(calls[0].function.arguments)["city"], str), calls[0]
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    typed = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "A person, as JSON."}], max_tokens=48, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
    person = json.loads(typed.choices[0].message.content)
    assert isinstance(person["name"], str) and isinstance(person["age"], int), person
    probs = client.chat.completions.create(model="m", messages=ASK, max_tokens=4, temperature=0,
                                           logprobs=True, top_logprobs=2)
    content = probs.choices[0].logprobs.content
    assert content and len(content[0].top_logprobs) == 2, probs.choices[0].logprobs
    return "chat, stream+usage, tool call, json_schema, logprobs"


def row_instructor(base):
    import instructor
    from openai import OpenAI
    from pydantic import BaseModel

    class Person(BaseModel):
        name: str
        age: int

    done = []
    for mode in (instructor.Mode.JSON_SCHEMA, instructor.Mode.TOOLS):
        client = instructor.from_openai(OpenAI(base_url=base + "/v1", api_key="unused"), mode=mode)
        person = client.chat.completions.create(
            model="m", response_model=Person, max_retries=0, max_tokens=48, temperature=0,
            messages=[{"role": "user", "content": "Alice is 31 years old. Extract the person."}])
        assert isinstance(person, Person) and isinstance(person.age, int), person
        done.append(mode.value)
    return "Person in " + ", ".join(done)


def row_langchain(base):
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    llm = ChatOpenAI(base_url=base + "/v1", api_key="unused", model="m", temperature=0, max_tokens=48)
    bound = llm.bind_tools([get_weather], tool_choice="get_weather")
    question = HumanMessage("What is the weather in Paris?")
    ai = bound.invoke([question])
    assert ai.tool_calls and ai.tool_calls[0]["name"] == "get_weather", ai
    result = get_weather.invoke(ai.tool_calls[0])
    assert isinstance(result, ToolMessage), result
    final = llm.invoke([question, ai, result])
    assert isinstance(final.content, str) and final.content, final
    return "bind_tools, tool round trip"


def row_llm(base):
    with tempfile.TemporaryDirectory() as home:
        with open(os.path.join(home, "extra-openai-models.yaml"), "w") as f:
            f.write(f"- model_id: treespec\n  model_name: m\n  api_base: {base}/v1\n")
        env = dict(os.environ, LLM_USER_PATH=home, OPENAI_API_KEY="unused")
        llm = os.path.join(os.path.dirname(sys.executable), "llm")
        out = subprocess.run([llm, "-m", "treespec", "-o", "max_tokens", "12", "-o", "temperature", "0",
                              "Name three colours."], capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0 and out.stdout.strip(), (out.returncode, out.stdout, out.stderr[-500:])
    return "prompt through the CLI"


STATS = '''def mean(values):
    return sum(values) / len(values)


def spread(values):
    return max(values) - min(values)
'''
ASK_EDIT = ("In stats.py, change `mean` so that it returns 0.0 for an empty list instead of raising. "
            "Leave `spread` as it is.")
CHECK_EDIT = "from stats import mean, spread; assert mean([]) == 0.0; assert mean([1, 2, 3]) == 2.0; " \
             "assert spread([4, 1, 9]) == 8"


def row_aider(base, edit_format):
    aider = os.environ.get("AIDER") or os.path.join(os.path.dirname(sys.executable), "aider")
    with tempfile.TemporaryDirectory() as work:
        with open(os.path.join(work, "stats.py"), "w") as f:
            f.write(STATS)
        extra = ["--timeout", "600", "--message", ASK_EDIT, "stats.py"]
        out = subprocess.run(aider_run.command(aider, base, edit_format, extra), cwd=work, capture_output=True,
                             text=True, env=aider_run.env(base), timeout=900)
        assert out.returncode == 0, (out.returncode, out.stdout[-800:], out.stderr[-800:])
        with open(os.path.join(work, "stats.py")) as f:
            edited = f.read()
        assert edited != STATS, ("no edit applied", out.stdout[-800:])
        check = subprocess.run([sys.executable, "-c", CHECK_EDIT], cwd=work, capture_output=True, text=True,
                               timeout=60)
        assert check.returncode == 0, ("the edited file fails its checks", edited, check.stderr[-400:])
    return f"one edit in the {edit_format} format, applied, the file's checks pass"


ROWS = {"openai": row_openai, "instructor": row_instructor, "langchain": row_langchain, "llm": row_llm,
        "aider-whole": lambda base: row_aider(base, "whole"),
        "aider-diff": lambda base: row_aider(base, "diff"),
        "aider-udiff": lambda base: row_aider(base, "udiff")}
DEFAULT_ROWS = "openai,instructor,langchain,llm"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base")
    ap.add_argument("--rows", default=DEFAULT_ROWS, help=f"any of {','.join(ROWS)}")
    a = ap.parse_args()
    failed = 0
    print("| client | result | checked |\n|---|---|---|")
    for name in a.rows.split(","):
        try:
            what = ROWS[name](a.base.rstrip("/"))
            print(f"| {name} | pass | {what} |", flush=True)
        except Exception as e:  # a failed row is reported, the others still run
            failed += 1
            why = f"{type(e).__name__}: {e}".replace("\n", " ")[:300]
            print(f"| {name} | FAIL | {why} |", flush=True)
            traceback.print_exc(file=sys.stderr)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
