"""Per-variant views: what only one variant has to show (`mta`: key-query kernels and head mixing;
`cope`: gates and counted positions; `dcmha`: Compose knock-out and borrowing; `infini`: memory vs
local heads and the memory knock-out)."""
