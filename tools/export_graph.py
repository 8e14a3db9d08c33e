"""export_graph.py — the regc graph JSON that tools/export_torch.py builds:
tensors (data inputs, constants, parameters, node outputs) and nodes, the
view peepholes that keep chains of reshapes and transposes short, the dead
nodes a fused pattern leaves dropped, and ids given in the graph model's
order (data inputs, constants, parameters, then the nodes) when written.

A dynamic value of the traced model is a Lazy view of such a tensor:
base.reshape(vshape).permute(perm), laid out only when an op needs it.
"""

import numpy as np


class ExportError(Exception):
    """A model the exporter cannot bring to regc; the message says why."""


class Tensor:
    """A regc tensor being built: a leaf (input, constant, parameter) or a
    node's output. Ids are given when the graph is written."""

    def __init__(self, name, dtype, shape, role=None):
        self.name, self.dtype, self.shape, self.role = name, dtype, tuple(shape), role
        self.id = None
        self.producer = None  # (op, inputs, attrs) of the node that made it


class Graph:
    def __init__(self):
        self.leaves, self.nodes = [], []

    def leaf(self, name, dtype, shape, role):
        t = Tensor(name, dtype, shape, role)
        self.leaves.append(t)
        return t

    def node(self, op, inputs, out_shapes, attrs=None, out_dtype="f32"):
        outs = [Tensor(None, out_dtype, s) for s in out_shapes]
        for o in outs:
            o.producer = (op, inputs, attrs or {})
        self.nodes.append((op, list(inputs), outs, dict(attrs or {})))
        return outs

    def one(self, op, inputs, shape, attrs=None):
        return self.node(op, inputs, [shape], attrs)[0]

    # views, with the peepholes that keep chains of them short
    def reshape(self, t, shape):
        shape = tuple(shape)
        if t.shape == shape:
            return t
        if t.producer and t.producer[0] == "reshape":
            t = t.producer[1][0]
            if t.shape == shape:
                return t
        return self.one("reshape", [t], shape, {"shape": list(shape)})

    def transpose(self, t, perm):
        perm = list(perm)
        if perm == sorted(perm):
            return t
        if t.producer and t.producer[0] == "transpose":
            inner = t.producer[2]["perm"]
            composed = [inner[p] for p in perm]
            src = t.producer[1][0]
            return self.transpose(src, composed)
        return self.one("transpose", [t], [t.shape[p] for p in perm], {"perm": perm})

    def to_json(self, outputs):
        # only what the outputs need: a fused pattern leaves the ops it
        # replaced unread
        used = set(id(t) for t in outputs)
        live = []
        for node in reversed(self.nodes):
            if any(id(o) in used for o in node[2]):
                live.append(node)
                used.update(id(t) for t in node[1])
        self.nodes = live[::-1]
        leaves = [t for t in self.leaves if id(t) in used or t.role == "input"]
        # data inputs, then constants, then parameters: the graph model's order
        order = {"input": 0, "constant": 1, "param": 2}
        leaves.sort(key=lambda t: order[t.role])
        next_id = 0
        tensors = []
        for t in leaves:
            t.id = next_id
            next_id += 1
            tensors.append({"id": t.id, "name": t.name, "dtype": t.dtype, "role": t.role,
                            "shape": list(t.shape)})
        nodes = []
        for op, ins, outs, attrs in self.nodes:
            for o in outs:
                o.id = next_id
                next_id += 1
            node = {"op": op, "in": [t.id for t in ins], "out": [o.id for o in outs]}
            node.update(attrs)
            nodes.append(node)
        return {"format": "regc-graph", "version": 1, "tensors": tensors, "nodes": nodes,
                "outputs": [t.id for t in outputs]}, leaves


# --------------------------------------------------------------------------- values


class Lazy:
    """A dynamic value: base.reshape(vshape).permute(perm), materialized
    only when an op needs it laid out."""

    def __init__(self, base, vshape=None, perm=None):
        self.base = base
        self.vshape = tuple(vshape if vshape is not None else base.shape)
        self.perm = list(perm if perm is not None else range(len(self.vshape)))

    @property
    def shape(self):
        return tuple(self.vshape[p] for p in self.perm)

    def plain(self):
        return self.perm == list(range(len(self.perm)))


def numel(shape):
    return int(np.prod(shape)) if len(shape) else 1
