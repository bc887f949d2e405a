"""Training and evaluating the bundled zoo: the code that needs both models and tasks/analyses.

It lives here, one floor above `hooked_models`, so that data flows one way (DESIGN.md): the
checkpoints and `hooked_models.zoo.available/path/load` stay below, what trains them on a task
and measures them lives here.

    python -m interp.zoo.train mha               a toy induction model (hooked_models/zoo)
    python -m interp.zoo.evaluate NAME [--write]  re-measure a bundled model's card metrics
    attnlens train --zoo text --device cuda       the text-language-model zoo (interp.zoo.text)
"""
