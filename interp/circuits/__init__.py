"""Circuits: QK/OV circuits and composition scores (`qk_ov`), composed circuits of head-mixing
variants (`composed`), circuits read over chosen tokens (`tokens`), and automatic circuit
discovery by edge attribution patching (`discovery`)."""
