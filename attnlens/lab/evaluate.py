"""Re-measure a bundled model's card metrics; `--write` stores them in its card.json.

    python -m attnlens.lab.evaluate induction-mha [--write]

Toy `induction-*` models are measured on their task
(`attnlens.interp.tasks.zoo_induction.induction_metrics`);
text language models (card "kind": "text-lm") by
`attnlens.interp.tools.text_eval.evaluate_text_model`; paper-task models (card "kind": "paper-task")
by their recipe's module (`attnlens.lab.paper`).
"""

from __future__ import annotations

import argparse
import json

from attnlens.hooked_models.zoo import available, load, path
from attnlens.interp.tasks.zoo_induction import induction_metrics

EVAL_MODULE = "attnlens.lab.evaluate"


def measure(name: str) -> dict:
    """The metrics of the bundled model `name`, as its card records them."""
    model = load(name)
    if (model.card or {}).get("kind") == "text-lm":
        from attnlens.interp.tools.text_eval import evaluate_text_model

        return evaluate_text_model(model, model.card, directory=path(name))
    if (model.card or {}).get("kind") == "paper-task":
        from attnlens.lab.paper._training import evaluate_model

        return evaluate_model(model)
    return induction_metrics(model)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("name", choices=available())
    parser.add_argument("--write", action="store_true", help="store the metrics in card.json")
    args = parser.parse_args(argv)
    metrics = measure(args.name)
    print(json.dumps(metrics, indent=2))
    if args.write:
        card_path = path(args.name) / "card.json"
        card = json.loads(card_path.read_text())
        card["metrics"] = metrics
        card["eval_command"] = f"python -m {EVAL_MODULE} {args.name} --write"
        card_path.write_text(json.dumps(card, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
