"""One optimizer step on the small models, for Kiln's optimizer numerics tests: from the same
initial weights as export_small.py, loss = sum(output), then torch.optim's SGD, SGD with momentum,
Adam and AdamW (lr 0.01, weight decay 0.01, momentum 0.9, default betas and eps) each take one step.
Writes OUT/NAME/optim/KIND/{PARAM.npy, momentum.PARAM.npy, adam.m.PARAM.npy, adam.v.PARAM.npy}.
Usage: export_optim.py OUT_DIR (run from scripts/)"""
import os, sys, numpy as np, torch
sys.argv = [sys.argv[0], sys.argv[1]]
import importlib.util
spec = importlib.util.spec_from_file_location("export_small_defs", os.path.join(os.path.dirname(__file__), "export_small.py"))
src = open(spec.origin).read().split("out = sys.argv[1]")[0]   # the model definitions only
defs = {}
exec(src, defs)
SMALL = defs["SMALL"]

OPTIMIZERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.01, weight_decay=0.01),
    "momentum": lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9, weight_decay=0.01),
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=0.01),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.01),
}

out = sys.argv[1]
for name, (ctor, make_input) in SMALL.items():
    for kind, make in OPTIMIZERS.items():
        torch.manual_seed(0)
        model = ctor()
        model.train()
        x = make_input()
        opt = make(list(model.parameters()))
        model(x).sum().backward()
        opt.step()
        d = os.path.join(out, name, "optim", kind)
        os.makedirs(d, exist_ok=True)
        for pname, p in model.named_parameters():
            np.save(os.path.join(d, pname + ".npy"), p.detach().numpy())
            st = opt.state[p]
            if st.get("momentum_buffer") is not None:
                np.save(os.path.join(d, "momentum." + pname + ".npy"), st["momentum_buffer"].numpy())
            if "exp_avg" in st:
                np.save(os.path.join(d, "adam.m." + pname + ".npy"), st["exp_avg"].numpy())
                np.save(os.path.join(d, "adam.v." + pname + ".npy"), st["exp_avg_sq"].numpy())
        print(name, kind, "exported")
