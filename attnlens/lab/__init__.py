"""Training and evaluating the bundled zoo: recipes, queues and evaluation of its models.

It lives on the production line (docs/design.md): the checkpoints and
`attnlens.hooked_models.zoo.available/path/load` stay in the library, what trains them on a task and
measures them lives here.

    python -m attnlens.lab.train mha               a toy induction model (hooked_models/zoo)
    python -m attnlens.lab.evaluate NAME [--write]  re-measure a bundled model's card metrics
    attnlens train --zoo text --device cuda       the text-LM zoo (attnlens.lab.text_train)
"""
