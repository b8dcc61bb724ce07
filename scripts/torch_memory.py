"""PyTorch's memory for one training step of each breadth model, measured as the anchors describe
(../shared/anchors.md): the joint forward and backward graphs that AOTAutograd traces, run in order with
every tensor freed after its last use and views taking no memory (a best case for PyTorch), with the
default partition and with the min-cut partition. The step is forward, loss = sum(output), backward;
parameters, the input batch and the gradients count. Writes OUT/NAME/torch_memory.json with bytes:
{"params", "input", "default", "mincut", "default_512", "mincut_512"}: the _512 peaks round every
storage up to 512 bytes, as PyTorch's CUDA caching allocator does with each block (the others are
exact byte sums, which no allocator reaches). Usage: torch_memory.py OUT_DIR [NAME...]
The min-cut partition needs networkx (Debian: python3-networkx)."""
import json, os, sys
import torch
from torch.fx import Interpreter
from functorch.compile import aot_function, default_partition, min_cut_rematerialization_partition
from export_breadth import DYNAMIC, instances


def replay(gm, args, live, peak):
    """Runs gm on args in order, adding each result's storage to live and dropping a value's storage
    after its last use (unless another live value shares it); peak[0] is the most bytes live, peak[1]
    the most with every storage rounded up to 512 bytes."""
    nodes = list(gm.graph.nodes)
    last = {}
    for i, node in enumerate(nodes):
        for a in node.all_input_nodes:
            last[a] = i
    interp = Interpreter(gm)
    interp.env = env = {}
    it = iter(args)
    for i, node in enumerate(nodes):
        if node.op == "placeholder":
            env[node] = next(it)
            continue
        if node.op == "output":
            return torch.fx.node.map_arg(node.args[0], lambda a: env[a])
        a, kw = interp.fetch_args_kwargs_from_env(node)
        env[node] = getattr(interp, node.op)(node.target, a, kw)
        for t in flat(env[node]):
            live[key(t)] = t.storage().nbytes()
        note(live, peak)
        for a in node.all_input_nodes:
            if last.get(a) == i and a.op != "placeholder" and not is_output(a, nodes):
                dead = env.pop(a)
                still = {key(t) for v in env.values() for t in flat(v)}
                for t in flat(dead):
                    if key(t) not in still:
                        live.pop(key(t), None)
    return None


def note(live, peak):
    peak[0] = max(peak[0], sum(live.values()))
    peak[1] = max(peak[1], sum(-(-n // 512) * 512 for n in live.values()))


def key(t):
    return t.storage().data_ptr()


def is_output(node, nodes):
    out = nodes[-1]
    return node in out.all_input_nodes


def flat(v):
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (list, tuple)):
        return [t for x in v for t in flat(x)]
    return []


def measure(model, x, partition):
    graphs = []

    def grab(gm, _):
        graphs.append(gm)
        return gm

    params = [p for p in model.parameters()]
    names = [n for n, _ in model.named_parameters()]

    def step(*args):
        ps, inp = args[:-1], args[-1]
        out = torch.func.functional_call(model, dict(zip(names, ps)), (inp,)) if hasattr(torch, "func") else \
            torch.nn.utils.stateless.functional_call(model, dict(zip(names, ps)), (inp,))
        return out.sum()

    f = aot_function(step, fw_compiler=grab, bw_compiler=grab, partition_fn=partition)
    leaves = [p.detach().clone().requires_grad_(True) for p in params]
    loss = f(*leaves, x)
    loss.backward()
    fw, bw = graphs
    # Replay both graphs with liveness tracking: parameters and the input live throughout.
    live = {}
    for t in leaves + [x]:
        live[t.storage().data_ptr()] = t.storage().nbytes()
    peak = [0, 0]
    note(live, peak)
    with torch.no_grad():
        outs = replay(fw, [p.detach() for p in leaves] + [x], live, peak)
        n_saved = len(outs) - 1
        saved = list(outs[1:]) if n_saved else []
        # Keep only the saved tensors (and the loss) from the forward.
        live.clear()
        for t in leaves + [x] + saved:
            live[t.storage().data_ptr()] = t.storage().nbytes()
        bw_args = saved + [torch.ones((), dtype=outs[0].dtype)]
        replay(bw, bw_args[:len([p for p in bw.graph.nodes if p.op == "placeholder"])], live, peak)
    return peak


if __name__ == "__main__":
    out = sys.argv[1]
    for name, model, x, _ in instances(set(sys.argv[2:])):
        if name in DYNAMIC:
            x = torch.cat([x, x[:1]], 0)
        try:
            default = measure(model, x, default_partition)
            mincut = measure(model, x, min_cut_rematerialization_partition)
            res = {
                "params": sum(p.numel() * p.element_size() for p in model.parameters()),
                "input": x.numel() * x.element_size(),
                "default": default[0],
                "mincut": mincut[0],
                "default_512": default[1],
                "mincut_512": mincut[1],
            }
        except Exception as e:  # noqa: BLE001 - report and go on
            print(name, "FAILED:", str(e).splitlines()[0] if str(e) else type(e).__name__)
            continue
        with open(os.path.join(out, name, "torch_memory.json"), "w") as fh:
            json.dump(res, fh)
        print(name, res)
