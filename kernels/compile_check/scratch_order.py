"""Does every per-program scratch buffer have a barrier between its writes and its reads?

Several kernels (DCMHA's tensor-core forward and backward, MTA's passes) stage values in a
global scratch buffer that one thread writes and other threads of the same program read back
in another layout. On a GPU that is only ordered by a CTA barrier (`tl.debug_barrier()`,
PTX `bar.sync`, which orders global memory among the block's threads) between the write and
the read (read after write), and between a read and the next overwrite (write after read).
The interpreter runs a program's threads in lockstep, so a missing barrier passes every CPU
test and races only on a GPU. This check finds such pairs without a GPU, from the kernel's
TTGIR (after Triton's pipeliner, so a load the pipeliner hoisted into an earlier iteration is
seen where it really runs).

Method (`hazards`): each pointer is traced back to the kernel arguments it derives from
(through `tt.addptr`, `tt.splat`, loop-carried values; not through loaded data). Walking the
ops in program order, every global access adds its argument to the set pending since the last
barrier; a plain load (or async copy) of an argument with a pending store or atomic from
another op is a read-after-write hazard; a store or atomic to an argument with a pending load
from another op is a write-after-read hazard. A load and a store through the very same pointer
value in one iteration touch the same addresses from the same threads (the same layout), so
they are not a hazard. A loop body is walked twice (the second pass sees the previous
iteration's pending accesses: an overwrite at the top of iteration i + 1 against a read at the
end of iteration i); an access pending from the previous iteration through a pointer computed
inside the loop is not exempt, since its value changes per iteration. Branches are joined.
Only arguments that are both read and written in the kernel are considered, and
atomic-to-atomic pairs are not hazards. Conservative: a pair reported may touch disjoint
addresses; a clean report means every such pair is separated by a barrier.

Example (no GPU; about 1-5 s per kernel):

    env -u TRITON_INTERPRET python -m attnlens.kernels.compile_check.scratch_order \\
        --ops dcmha mta --archs 90 80
"""

from __future__ import annotations

import argparse
import functools
import re
import sys
from dataclasses import dataclass, field

_DEF = re.compile(r"^\s*(%[\w.$-]+)(?::\d+)?\s*=\s*(.*)$")
_NAME = re.compile(r"%[\w.$-]+")
_LOC_DEF = re.compile(r"^(#loc\d*)\s*=\s*loc\((.*)\)\s*$")
_LOC_USE = re.compile(r"loc\((#loc\d*)\)\s*$")
_ARG = re.compile(r"(%[\w.$-]+):\s*!tt\.ptr<")
_ITER = re.compile(r"iter_args\((.*?)\)\s*->")
_BARRIERS = ("ttg.barrier", "gpu.barrier")
_LOADS = ("tt.load ", "ttg.async_copy_global_to_local ")
_STORES = ("tt.store ",)
_ATOMICS = ("tt.atomic_rmw ", "tt.atomic_cas ")


@dataclass(frozen=True)
class Access:
    """One global access: `kind` load / store / atomic, the pointer value, the source line."""

    kind: str
    arg: str
    pointer: str
    where: str
    loops: tuple          # ids of the loops around the pointer's definition
    value: str | None = None     # a load's result id, or the stored value's id


@dataclass(frozen=True)
class Hazard:
    """A pair of accesses to one argument with no barrier between them, `first` before
    `second` in program order (or in the previous iteration when `across_iterations`)."""

    kind: str             # "read after write" or "write after read"
    arg: str
    first: str
    second: str
    across_iterations: bool
    accepted: str = ""    # why a person accepted the pair (`ACCEPTED`), if one did

    def describe(self) -> str:
        again = " (previous iteration)" if self.across_iterations else ""
        text = (f"{self.kind} on {self.arg}: {_short(self.first)}{again} then "
                f"{_short(self.second)}, no barrier between")
        return text + (f" [accepted: {self.accepted}]" if self.accepted else "")


# Pairs checked by hand, keyed by file, function and one access's source text, so an edit of
# that line drops the acceptance and the pair is reported again for review. An entry accepts
# the pairs of that access with accesses of the PREVIOUS loop iteration (its loop's iterations
# touch disjoint slots: a head, a d_head chunk, a row window of their own, which the check
# cannot prove, since it compares no addresses), and within one iteration only the partner
# lines it names, with the pair's kind. An entry's optional third field is how many of the
# innermost loops around its pointer's definition it speaks for (default 1: the innermost
# only), so a barrier missing at the end of an outer loop (a key tile) is still reported.
_SCRATCH_LOAD = 'return tl.load(_scratch(SCR, n, j, BLOCK_M, BLOCK_N), cache_modifier=".cg")'
# The MTA out pass's phase-3 read of P a row tap down (`_post_tap_rows`: a window alone's loop
# and a pair's `_conv_post_pair`).
_P_ROW_TAP = "return tl.load(P + (offs_ar[:, None] + a) * AC + offs_ac[None, :],"
ACCEPTED = {
    ("triton_fwd_tc.py", "_out_tile", "tl.store(_scratch(SCR, n, BLOCK_M, BLOCK_N), a)"): (
        "head n's slot: iteration n reads slot n, then (after a barrier) writes it; the next "
        "iteration reads slot n + 1", ()),
    ("triton_fwd_tc.py", "_lse_tile", "tl.store(new + at, tl.join(m_new, l_new))"): (
        "double-buffered state: a key tile reads `old` and writes `new`, the other half (with "
        "the head loop pipelined, HEAD_STAGES > 1, a later head's `old` is read after this "
        "head's `new` is written: still the other half)",
        (("write after read",
          'm_old, l_old = tl.split(tl.load(old + at, cache_modifier=".cg"))'),
         ("read after write",
          'm_old, l_old = tl.split(tl.load(old + at, cache_modifier=".cg"))'))),
    ("triton_bwd_tc.py", "_stored_hidden_packed",
     "tl.store(_scratch(SCR, n, j, BLOCK_M, BLOCK_N), s)"): (
        "head n's slot j, written once per head loop, read after the tile's next barrier; "
        "written as slot 2 (dP) after the head loop that reads slot 0",
        (("write after read", _SCRATCH_LOAD),)),
    ("triton_bwd_tc.py", "_store_both", "tl.store(_scratch(SCR, n, j, BLOCK_M, BLOCK_N), x)"): (
        "head n's slot j, read only after the next barrier; the loops that write it (j = 1, 3) "
        "read other slots (0; 2 and 1), which their pipelined form (HEAD_STAGES > 1) reads "
        "for later heads around this write",
        (("read after write", _SCRATCH_LOAD), ("write after read", _SCRATCH_LOAD))),
    ("triton_bwd_tc.py", "_store_both",
     "tl.store(_scratch_t(SCR, n, j, BLOCK_M, BLOCK_N), tl.trans(x))"): (
        "head n's transposed slot 4 + j (j = 1, 3), read only after the next barrier; the same "
        "iteration read slots 0 and 2 (pipelined, HEAD_STAGES > 1: also after this write, for "
        "later heads)", (("write after read", _SCRATCH_LOAD), ("read after write", _SCRATCH_LOAD))),
    ("triton_bwd_tc.py", "dcmha_tc_grads_kernel",
     "tl.store(_scratch_t(SCR, n, 0, BLOCK_M, BLOCK_N), tl.trans(s))"): (
        "head n's transposed slot 4, read only after the next barrier; the same iteration "
        "read slot 0 (pipelined, HEAD_STAGES > 1: also after this write, for later heads)",
        (("write after read", _SCRATCH_LOAD), ("read after write", _SCRATCH_LOAD))),
    ("triton_bwd_tc.py", "dcmha_tc_grads_kernel",
     "tl.store(_scratch_t(SCR, n, 2, BLOCK_M, BLOCK_N), tl.trans(dp))"): (
        "head n's transposed slot 6; the same iteration read slot 2 before and then reads "
        "slot 1 (A, written before the last barrier)",
        (("read after write", _SCRATCH_LOAD), ("write after read", _SCRATCH_LOAD))),
    ("triton_bwd_tc.py", "_acc_chan",
     'tl.store(at, tl.load(at, mask=ok, other=0.0, cache_modifier=".cg") + vals, mask=ok)'): (
        "head n's column of the program's partial rows: each head loop iteration its own", ()),
    ("triton_bwd_tc.py", "_row_grads",
     'tl.store(at, tl.load(at, mask=r_ok, other=0.0, cache_modifier=".cg") + tl.sum(x * g, 1),'): (
        "head n's column of the program's partial rows: each head loop iteration its own", ()),
    ("triton_bwd_tc.py", "_acc_dq", "tl.store(at, acc, mask=r_ok[:, None])"): (
        "head n's d_head chunk d0 of dq's partial rows: each (n, d0) iteration its own", (), 2),
    ("bwd_tiles.py", "add_dot_heads",
     "tl.store(ptr, tl.load(ptr, mask=ok, other=0.0) + _dot(xc, y, IEEE), mask=ok)"): (
        "d_head chunk d0 of the entries the program holds (its turn or its own slot): each d0 "
        "iteration its own", ()),
    ("bwd_tiles.py", "add_dot_heads_slot",
     "tl.store(ptr, tl.load(ptr, mask=ok, other=0.0) + _dot(xc, y, IEEE), mask=ok)"): (
        "d_head chunk d0 of the program's slot rows: each d0 iteration its own, and the "
        "caller's row loop passes distinct rows per call", (), 2),
    ("bwd_tiles.py", "add_slot_in_turn", "tl.store(SRC + offs, tl.zeros_like(x), mask=ok)"): (
        "elements i0 .. i0 + BLOCK of the program's accumulator: each i0 iteration its own, "
        "read and cleared by the same thread", ()),
    ("bwd_tiles.py", "add_slot_in_turn",
     "tl.store(DST + offs, tl.load(DST + offs, mask=ok, other=0.0) + x, mask=ok)"): (
        "elements i0 .. i0 + BLOCK of the row window's slot (the program's turn): each i0 "
        "iteration its own, read and written by the same thread", ()),
    ("triton_bwd.py", "_delta_window",
     "tl.store(ptr, tl.load(ptr, mask=own, other=0.0) + part, mask=own)"): (
        "rows r0 of the split's delta slot: each r0 iteration its own rows", ()),
    ("triton_fwd.py", "mta_out_kernel",
     "tl.store(c_st + n * (AR * AC) + offs_ar[:, None] * AC + offs_ac[None, :],"): (
        "phase 3 writes head n's map in the C half of the stage (c_st) and reads only the P "
        "half (p_st), each head its own map",
        (("write after read", _P_ROW_TAP),)),
    ("triton_fwd.py", "mta_out_kernel",
     "tl.store(dst + hk, tl.where(ok[None, :, :], pattern, 0.0).to(w2t.dtype))"): (
        "phase 4 writes key chunk c0 of the P half (dst = p_st; read only after the next "
        "barrier) or, for a pair's first window (PAIRS), of the part after the C half (dst = "
        "p_st + 2 HB AR AC; read only in the next window's phase 5, after barriers), and "
        "reads only C (src: the C half, c_st = p_st + HB AR AC; with PAIR_PHASES a pair's first "
        "window's C over its P in part 0, whose pattern goes to part 2, and its second's in "
        "part 1, whose pattern goes to part 0): never the part it writes, but the pointers' "
        "offsets are set at run time, so the check cannot tell the parts apart",
        (("write after read", "x = tl.load(src + hk, mask=h_valid[:, None, None], other=0.0)"),)),
    ("triton_fwd.py", "_conv_post_pair", "tl.store(PA + own, conv_a.to(PA.dtype.element_ty))"): (
        "PAIR_PHASES' phase 3, head n's C over head n's P of a pair's first window, after the "
        "barrier that follows every read of that P; the next head loop iteration reads head "
        "n + 1's P, and the single-window loop after it reads P only for a window alone (mode "
        "0; its head count is 0 for a pair's first window)", (("read after write", _P_ROW_TAP),)),
    ("triton_fwd.py", "_conv_post_pair", "tl.store(PB + own, conv_b.to(PB.dtype.element_ty))"): (
        "as the store to PA, for the pair's second window's part",
        (("read after write", _P_ROW_TAP),)),
    ("triton_fwd.py", "_z_add_head",
     "tl.store(z_ptr, tl.load(z_ptr, mask=z_mask, other=0.0) + _dot(pattern, v, IEEE),"): (
        "the out pass's phase 5: head n (n2) and d_head chunk d0 of the window's z rows, read "
        "and written by the same thread: each (head, chunk) iteration its own", (), 2),
}


def _short(where: str) -> str:
    return where.rsplit("/", 1)[-1]


@functools.lru_cache(maxsize=64)
def _source_lines(path: str) -> tuple[str, ...]:
    """A source file's lines, read once per sweep (every reported pair looks up two)."""
    with open(path) as f:
        return tuple(f.read().splitlines())


def _source_line(where: str) -> tuple[str, str, str]:
    """(file name, enclosing function, stripped source text) of `path:line`; empty text if
    unreadable."""
    path, _, line = where.rpartition(":")
    name = path.rsplit("/", 1)[-1]
    try:
        lines = _source_lines(path)
        i = int(line) - 1
        text = lines[i].strip()
    except (OSError, ValueError, IndexError):
        return name, "", ""
    func = next((m.group(1) for j in range(i, -1, -1)
                 if (m := re.match(r"\s*def (\w+)", lines[j]))), "")
    return name, func, text


def accepted_reason(kind: str, first: Access, second: Access, carried) -> str:
    """Why the pair `first` then `second` is accepted (`ACCEPTED`), or "" when it is not. A
    pair carried by a loop is accepted at an access whose pointer that loop changes (the loop
    is the innermost around the pointer's definition: each iteration its own slot); a pair
    within one iteration only when the entry names the partner's source text and the kind."""
    a, b = _source_line(first.where), _source_line(second.where)
    for mine, access, other in ((a, first, b), (b, second, a)):
        entry = ACCEPTED.get(mine)
        if not entry:
            continue
        covers = entry[2] if len(entry) > 2 else 1
        if carried and carried in access.loops[len(access.loops) - covers:]:
            return entry[0]
        if not carried and (kind, other[2]) in entry[1]:
            return entry[0]
    return ""


@dataclass
class _Pending:
    writes: dict = field(default_factory=dict)   # arg -> {(Access, carrying loop or None)}
    reads: dict = field(default_factory=dict)

    def copy(self) -> _Pending:
        return _Pending({k: set(v) for k, v in self.writes.items()},
                        {k: set(v) for k, v in self.reads.items()})

    def merge(self, other: _Pending) -> None:
        for mine, theirs in ((self.writes, other.writes), (self.reads, other.reads)):
            for k, v in theirs.items():
                mine.setdefault(k, set()).update(v)

    def settled(self, loop: int) -> _Pending:
        """After `loop` ends, its previous-iteration marks no longer apply."""
        def unmark(mine):
            return {k: {(a, None if c == loop else c) for a, c in v} for k, v in mine.items()}
        return _Pending(unmark(self.writes), unmark(self.reads))

    def carried(self, loop: int, before: _Pending) -> _Pending:
        """The accesses the loop body added to `before` (the state at the loop's entry),
        marked as coming from the previous iteration of `loop`."""
        def mark(mine, theirs):
            return {k: {(a, loop) for a, c in v if (a, c) not in theirs.get(k, ())}
                    for k, v in mine.items()}
        return _Pending(mark(self.writes, before.writes), mark(self.reads, before.reads))


# -- parsing -----------------------------------------------------------------------------------

def _locations(text: str) -> dict:
    raw = {}
    for line in text.splitlines():
        m = _LOC_DEF.match(line)
        if m:
            raw[m.group(1)] = m.group(2)

    def resolve(key, depth=0):
        body = raw.get(key, "")
        if depth > 50:
            return "?"
        m = re.match(r'^"([^"]+)":(\d+):\d+$', body)
        if m:
            return f"{m.group(1)}:{m.group(2)}"
        m = re.match(r"^callsite\((#loc\d*) at (#loc\d*)\)$", body)
        if m:
            return resolve(m.group(1), depth + 1)
        m = re.match(r'^"[^"]*"\((#loc\d*)\)$', body)
        if m:
            return resolve(m.group(1), depth + 1)
        return "?"

    return {k: resolve(k) for k in raw}


@dataclass
class _Op:
    text: str
    where: str
    result: str | None = None                        # the value id it defines
    callee: str | None = None                        # a tt.call's function
    operands: list = field(default_factory=list)     # resolved value ids, in order
    children: list = field(default_factory=list)     # regions: lists of _Op
    loop: int | None = None                          # id, when the op is a loop


class _Scopes:
    """SSA names resolved per region: MLIR's printer reuses a name in sibling regions (two
    loop bodies may both define `%f_181`), so each definition gets a unique id."""

    def __init__(self):
        self.stack: list = [{}]
        self.count = 0

    def define(self, name: str, where: int = -1) -> str:
        self.count += 1
        uid = f"{name}@{self.count}"
        self.stack[where][name] = uid
        return uid

    def lookup(self, name: str) -> str | None:
        base = name.split("#")[0]
        for scope in reversed(self.stack):
            if base in scope:
                return scope[base]
        return None

    def resolve_all(self, text: str) -> list:
        return [u for u in (self.lookup(n) for n in _NAME.findall(text)) if u]


_FUNC = re.compile(r"tt\.func\s+(?:public|private)?\s*@([\w.$-]+)\(")
_CALL = re.compile(r"tt\.call\s+@([\w.$-]+)\(")
_PARAM = re.compile(r"(%[\w.$-]+):\s")


@dataclass
class _Module:
    """A TTGIR module parsed: each function's body (nested ops, operands resolved to unique
    value ids) and parameter ids; the public kernel's pointer arguments; one value graph
    (id -> ids it derives from; a callee's parameter derives from the call's operands, a call's
    result from the callee's returned values); the loops around each definition."""

    bodies: dict
    params: dict
    kinds: dict                 # value id -> the op that defines it (arith.addf, tt.dot, ...)
    operands: dict              # value id -> its defining op's operand ids, in order
    kernel: str
    pointer_args: set
    edges: dict
    defined_in: dict


def _parse(text: str) -> _Module:
    locs = _locations(text)
    lines = text.splitlines()
    scopes = _Scopes()
    edges: dict = {}
    defined_in: dict = {}
    kinds: dict = {}
    op_operands: dict = {}
    bodies: dict = {}
    params: dict = {}
    returns: dict = {}          # function -> [returned ids]
    calls: list = []            # (callee, operand ids, result id)
    kernel, pointer_args = None, set()
    loop_ids = 0
    i = 0
    while i < len(lines):
        head = _FUNC.search(lines[i])
        if not head:
            i += 1
            continue
        name = head.group(1)
        scopes.stack = [{}]
        names = _PARAM.findall(lines[i].split("attributes")[0])
        params[name] = [scopes.define(n, 0) for n in names]
        if "tt.func public" in lines[i] and kernel is None:
            kernel = name
            pointer_args = {uid for n, uid in zip(names, params[name], strict=True)
                            if n in set(_ARG.findall(lines[i]))}
        stack = [[]]                # open regions
        owners = []                 # the op each open region belongs to
        loop_stack: list = []
        yields: dict = {}           # loop id -> [yield operand ids]
        loop_results: dict = {}     # loop id -> (result id, iter-arg ids)
        i += 1
        while i < len(lines):
            s = lines[i].strip()
            i += 1
            if not s or s.startswith("#loc") or s.startswith("^"):
                continue
            loc = _LOC_USE.search(s)
            where = locs.get(loc.group(1), "?") if loc else "?"
            if s.startswith("}"):
                if not owners:
                    break                               # the function's end
                op = owners.pop()
                stack.pop()
                scopes.stack.pop()
                if op.loop is not None and loop_stack and loop_stack[-1] == op.loop:
                    loop_stack.pop()
                if s.rstrip().endswith("{"):             # "} else {"
                    region: list = []
                    op.children.append(region)
                    stack.append(region)
                    owners.append(op)
                    scopes.stack.append({})
                continue
            body = s.split(" loc(")[0]
            m = _DEF.match(body)
            rhs = m.group(2) if m else body
            op = _Op(s, where, operands=scopes.resolve_all(rhs.split(" : ")[0]))
            stack[-1].append(op)
            if "scf.for " in body:
                loop_ids += 1
                op.loop = loop_ids
                result = scopes.define(m.group(1)) if m else None
                if result:
                    defined_in[result] = tuple(loop_stack)
                scopes.stack.append({})                    # the body's block arguments
                iters = _ITER.search(body)
                carried = []
                if iters:
                    for pair in iters.group(1).split(","):
                        if "=" in pair:
                            x, y = (t.strip() for t in pair.split("=", 1))
                            init = scopes.lookup(y)
                            uid = scopes.define(x)
                            carried.append(uid)
                            edges[uid] = {init} if init else set()
                            defined_in[uid] = tuple(loop_stack) + (loop_ids,)
                loop_results[loop_ids] = (result, carried)
                region = []
                op.children.append(region)
                stack.append(region)
                owners.append(op)
                loop_stack.append(loop_ids)
                continue
            call = _CALL.search(rhs)
            if call:
                op.callee = call.group(1)
            if m:
                kind = rhs.split()[0] if rhs.split() else ""
                uid = scopes.define(m.group(1))
                op.result = uid
                kinds[uid] = kind
                op_operands[uid] = op.operands
                edges[uid] = (set() if kind in ("tt.load", "ttg.local_load", "tt.atomic_rmw",
                                                 "tt.atomic_cas", "tt.call") else set(op.operands))
                defined_in[uid] = tuple(loop_stack)
            if call:
                calls.append((op.callee, op.operands, op.result))
            if body.startswith("tt.return"):
                returns.setdefault(name, []).extend(op.operands)
            if body.startswith("scf.yield") and loop_stack and owners and \
                    owners[-1].loop == loop_stack[-1]:
                yields.setdefault(loop_stack[-1], []).extend(op.operands)
            if s.rstrip().endswith("{"):
                region = []
                op.children.append(region)
                stack.append(region)
                owners.append(op)
                scopes.stack.append({})
        for lid, (result, carried) in loop_results.items():
            ys = yields.get(lid, [])
            for uid, y in zip(carried, ys, strict=False):     # ys: [] if no yield
                edges[uid].add(y)
            if result:
                edges[result] = set(ys)
        bodies[name] = stack[0]
    if kernel is None:
        raise ValueError("no public tt.func in the TTGIR text")
    for callee, args, result in calls:
        for param, arg in zip(params.get(callee, []), args, strict=False):
            edges.setdefault(param, set()).add(arg)
        if result:
            edges[result] = set(returns.get(callee, []))
    return _Module(bodies, params, kinds, op_operands, kernel, pointer_args, edges, defined_in)


def _roots(uid: str, edges: dict, pointer_args: set, memo: dict) -> frozenset:
    if uid in memo:
        return memo[uid]
    seen, todo, out = {uid}, [uid], set()
    while todo:
        v = todo.pop()
        if v in pointer_args:
            out.add(v)
            continue
        for n in edges.get(v, ()):
            if n not in seen:
                seen.add(n)
                todo.append(n)
    memo[uid] = frozenset(out)
    return memo[uid]


def _access(op: _Op, edges, pointer_args, defined_in, memo) -> list[Access]:
    body = op.text.split(" loc(")[0]
    m = _DEF.match(body)
    rhs = m.group(2) if m else body
    for kinds, kind in ((_LOADS, "load"), (_STORES, "store"), (_ATOMICS, "atomic")):
        if any(rhs.startswith(prefix) for prefix in kinds):
            if not op.operands:
                return []
            ptr = op.operands[0]     # tt.atomic_rmw fadd, relaxed, gpu, %ptr, ...: the first
            value = op.result if kind == "load" else (op.operands[1] if len(op.operands) > 1
                                                      else None)
            return [Access(kind, arg.split("@")[0], ptr, op.where, defined_in.get(ptr, ()),
                           value)
                    for arg in sorted(_roots(ptr, edges, pointer_args, memo))]
    return []


# -- the walk ----------------------------------------------------------------------------------

_ELEMENTWISE = ("arith.", "math.", "ttg.convert_layout", "tt.fp_to_fp", "tt.bitcast",
                "tt.precise_", "tt.clampf", "tt.extern_elementwise", "ttng.warp_group_dot_wait")
_DOTS = ("tt.dot", "ttng.warp_group_dot")


def _elementwise(kind: str) -> bool:
    return kind.startswith(_ELEMENTWISE) and kind not in ("arith.constant",)


class _Walker:
    def __init__(self, module: _Module):
        self.module = module
        self.edges, self.pointer_args = module.edges, module.pointer_args
        self.defined_in = module.defined_in
        self.memo: dict = {}
        self.dep_memo: dict = {}
        self.found: dict = {}
        self.call_loops: tuple = ()    # the caller's loops while a callee's body is walked
        accesses = [a for body in module.bodies.values() for op in self._ops(body)
                    for a in self._accesses(op)]
        read = {a.arg for a in accesses if a.kind == "load"}
        written = {a.arg for a in accesses if a.kind in ("store", "atomic")}
        self.scratch = read & written

    def _ops(self, region):
        for op in region:
            yield op
            for child in op.children:
                yield from self._ops(child)

    def _accesses(self, op) -> list[Access]:
        found = _access(op, self.edges, self.pointer_args, self.defined_in, self.memo)
        if self.call_loops:          # a callee's pointers are recomputed on every call
            found = [Access(a.kind, a.arg, a.pointer, a.where, self.call_loops + a.loops,
                            a.value) for a in found]
        return found

    def run(self) -> list[Hazard]:
        self._region(self.module.bodies[self.module.kernel], _Pending(), loop=None, loops=())
        return list(self.found.values())

    @staticmethod
    def _same_values(a: Access, b: Access, carried) -> bool:
        """Same pointer value: the same op's value in this iteration, or a value defined
        outside the loop (`carried`) the previous iteration's access came through."""
        if a.pointer != b.pointer:
            return False
        return not carried or carried not in a.loops

    def _depends(self, value: str | None, on: str | None) -> bool:
        """Whether each element of the stored `value` is computed from the same element of
        the load result `on`, through elementwise ops and layout changes only: then the load
        of an address completed before the store to it issues, in whichever threads (a value
        that moves between threads goes through shared memory behind a barrier, or a warp
        shuffle). A dot, reduction, transpose or broadcast on the way breaks the argument."""
        if value is None or on is None:
            return False
        key = (value, on)
        if key not in self.dep_memo:
            seen, todo = {value}, [value]
            while todo and on not in seen:
                v = todo.pop()
                kind = self.module.kinds.get(v, "")
                if kind in _DOTS:          # elementwise in its accumulator only
                    nexts = self.module.operands.get(v, [])[2:3]
                elif _elementwise(kind):
                    nexts = self.edges.get(v, ())
                else:
                    continue
                for n in nexts:
                    if n not in seen:
                        seen.add(n)
                        todo.append(n)
            self.dep_memo[key] = on in seen
        return self.dep_memo[key]

    def _report(self, kind, first: Access, second: Access, carried):
        reason = accepted_reason(kind, first, second, carried)
        h = Hazard(kind, first.arg.lstrip("%"), first.where, second.where, bool(carried),
                   reason)
        self.found.setdefault((h.kind, h.arg, h.first, h.second, carried), h)

    def _region(self, region, state: _Pending, loop, loops: tuple, depth: int = 0) -> _Pending:
        for op in region:
            text = op.text
            if any(text.startswith(b) for b in _BARRIERS):
                state = _Pending()
                continue
            if op.loop is not None:
                inner = loops + (op.loop,)
                entry = state.copy()
                first = self._region(op.children[0], state.copy(), op.loop, inner, depth)
                again = entry.copy()
                again.merge(first.carried(op.loop, entry))
                second = self._region(op.children[0], again, op.loop, inner, depth)
                state = entry
                state.merge(first)
                state.merge(second.settled(op.loop))
                continue
            if op.children:                       # scf.if / else: join the branches
                out = state.copy() if len(op.children) < 2 else _Pending()
                for child in op.children:
                    out.merge(self._region(child, state.copy(), loop, loops, depth))
                state = out
                continue
            if op.callee in self.module.bodies and depth < 16:
                saved, self.call_loops = self.call_loops, self.call_loops + loops
                state = self._region(self.module.bodies[op.callee], state, loop, (), depth + 1)
                self.call_loops = saved
                continue
            for acc in self._accesses(op):
                if acc.arg not in self.scratch:
                    continue
                if acc.kind == "load":
                    for prev, carried in state.writes.get(acc.arg, ()):
                        if not self._same_values(prev, acc, carried):
                            self._report("read after write", prev, acc, carried)
                    state.reads.setdefault(acc.arg, set()).add((acc, None))
                else:
                    for prev, carried in state.reads.get(acc.arg, ()):
                        if not carried and self._depends(acc.value, prev.value):
                            continue
                        if not self._same_values(prev, acc, carried):
                            self._report("write after read", prev, acc, carried)
                    state.writes.setdefault(acc.arg, set()).add((acc, None))
        return state


def hazards(ttgir: str, include_accepted: bool = False) -> list[Hazard]:
    """Unordered scratch accesses of the kernel whose TTGIR text is `ttgir` (module docstring);
    the pairs `ACCEPTED` lists only with `include_accepted`."""
    found = _Walker(_parse(ttgir)).run()
    return [h for h in found if include_accepted or not h.accepted]


def scratch_args(ttgir: str) -> list[str]:
    """The pointer arguments the kernel both reads and writes (those the check follows)."""
    return sorted(a.lstrip("%") for a in _Walker(_parse(ttgir)).scratch)


# -- compiling to TTGIR ------------------------------------------------------------------------

def launch_ttgir(launch, arch: int) -> str:
    """The TTGIR Triton makes for `launch` on sm_`arch` (the front end and the TTGIR passes
    only: no PTX or ptxas, about a second per kernel)."""
    from triton._C.libtriton import ir
    from triton.compiler import ASTSource, make_backend

    from .compiler import _specialise, private_triton_cache

    private_triton_cache()
    target, signature, constexprs, attrs, options = _specialise(launch, arch)
    src = ASTSource(launch.kernel, signature, constexprs, attrs)
    backend = make_backend(target)
    opts = backend.parse_options(dict(options.__dict__, **src.parse_options()))
    stages: dict = {}
    backend.add_stages(stages, opts, src.language)
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = src.make_ir(target, opts, backend.get_codegen_implementation(opts),
                         backend.get_module_map(), context)
    metadata = {"target": target, **opts.__dict__}
    for ext, stage in stages.items():
        module = stage(module, metadata)
        if ext == "ttgir":
            return str(module)
    raise RuntimeError("the backend has no ttgir stage")


def check(ops=None, archs=(90, 80), dtypes=("bf16",), d_heads=(64, 128), options=None):
    """Rows (op, option, dtype, d_head, arch, kernel, scratch arguments, hazards) for every
    launch of the selected compile-check cases."""
    from .run import _first_configs, _record, select_cases

    rows, seen = [], set()
    for case in select_cases(ops, options=options):
        for dtype in dtypes:
            for d in d_heads:
                for arch in archs:
                    for launch in _first_configs(_record(case, dtype, d, arch)):
                        key = (launch.name, launch.config, dtype, d, arch, case.name)
                        if key in seen:
                            continue
                        seen.add(key)
                        text = launch_ttgir(launch, arch)
                        found = hazards(text, include_accepted=True)
                        rows.append(dict(op=case.op, option=case.name, dtype=dtype, d_head=d,
                                         arch=arch, kernel=launch.name,
                                         scratch=scratch_args(text),
                                         hazards=[h for h in found if not h.accepted],
                                         accepted=[h for h in found if h.accepted]))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", nargs="*", default=["dcmha", "mta"])
    p.add_argument("--options", nargs="*", default=None)
    p.add_argument("--archs", nargs="*", type=int, default=[90, 80])
    p.add_argument("--dtypes", nargs="*", default=["bf16"])
    p.add_argument("--d-heads", nargs="*", type=int, default=[64, 128])
    p.add_argument("--show-accepted", action="store_true",
                   help="also list the pairs ACCEPTED lists (checked by hand)")
    a = p.parse_args(argv)
    rows = check(a.ops, a.archs, a.dtypes, a.d_heads, a.options)
    bad = 0
    for r in rows:
        status = "ok" if not r["hazards"] else f"{len(r['hazards'])} HAZARDS"
        if r["accepted"]:
            status += f" ({len(r['accepted'])} accepted)"
        print(f"{r['op']:6} {r['option']:16} {r['dtype']} d{r['d_head']} sm_{r['arch']} "
              f"{r['kernel']:28} scratch={','.join(r['scratch']) or '-'}  {status}")
        for h in r["hazards"] + (r["accepted"] if a.show_accepted else []):
            print("    " + h.describe())
        bad += bool(r["hazards"])
    print(f"{len(rows)} kernels, {bad} with unordered scratch accesses")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["ACCEPTED", "Access", "Hazard", "accepted_reason", "check", "hazards", "launch_ttgir",
           "main", "scratch_args"]
