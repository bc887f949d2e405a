"""docs/reproduction.md: the page (`page`) and one section module per paper (`mta`, `cope`,
`dcmha`, `dcmha_text`, `infini`), written from the paper-task cards
(`python -m attnlens.lab.paper report`)."""
