"""The step's optimizer as torch.optim sees it.

A step compiled with an optimizer keeps a torch.optim optimizer (SGD, Adam or AdamW: the one the user
passed, or one made from the optimizer's name) as the place where PyTorch code reads and moves its
hyper-parameters and its state:

- its param_groups are the step's parameter groups; before every step the learning rate, the momentum
  and the betas of each group are copied into the step (so any torch.optim.lr_scheduler drives it), while
  weight decay and eps, compiled into the step, may not change;
- its state holds views of the step's moments and step count, in torch.optim's keys (exp_avg,
  exp_avg_sq, max_exp_avg_sq, momentum_buffer, step): optimizer.state_dict() is torch's format, and
  optimizer.load_state_dict() is copied into the step before its next use;
- its step() does nothing (the compiled step updates the parameters), and each compiled step counts as
  one optimizer.step() for the schedulers.
"""
import types

from ._errors import KilnError

# The per-parameter state each kind keeps, torch.optim's key -> Kiln's state name prefix.
_STATE = {"sgd": {}, "momentum": {"momentum_buffer": "momentum."},
          "adam": {"exp_avg": "adam.m.", "exp_avg_sq": "adam.v."},
          "adamw": {"exp_avg": "adam.m.", "exp_avg_sq": "adam.v."}}
_AMSGRAD = {"max_exp_avg_sq": "adam.vmax."}
# A group's hyper-parameters that the step holds as state, torch's key -> Kiln's state name.
_HYPER = {"sgd": {"lr": "optimizer.lr"}, "momentum": {"lr": "optimizer.lr", "momentum": "optimizer.momentum"},
          "adam": {"lr": "optimizer.lr", "betas": ("optimizer.beta1", "optimizer.beta2")},
          "adamw": {"lr": "optimizer.lr", "betas": ("optimizer.beta1", "optimizer.beta2")}}
# The ones compiled into the step, which may not change.
_FIXED = {"sgd": ("weight_decay", "momentum", "nesterov", "dampening", "maximize"),
          "momentum": ("weight_decay", "nesterov", "dampening", "maximize"),
          "adam": ("weight_decay", "eps", "amsgrad", "maximize"), "adamw": ("weight_decay", "eps", "amsgrad", "maximize")}


def make(kind, params, lr, momentum, betas, eps, weight_decay, nesterov, amsgrad):
    """A torch.optim optimizer for the optimizer's name (PyTorch's defaults where None)."""
    import torch

    lr = 1e-3 if lr is None else lr
    betas = (0.9, 0.999) if betas is None else tuple(betas)
    eps = 1e-8 if eps is None else eps
    if kind in ("sgd", "momentum"):
        if momentum is None:
            momentum = 0.9 if kind == "momentum" else 0.0
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay or 0.0,
                               nesterov=bool(nesterov))
    if nesterov:
        raise ValueError(f"nesterov is SGD's (optimizer='sgd' with momentum), not {kind!r}'s")
    if momentum:
        raise ValueError(f"momentum is SGD's; {kind!r} takes betas")
    if kind == "adam":
        return torch.optim.Adam(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay or 0.0,
                                amsgrad=bool(amsgrad))
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps,
                                 weight_decay=0.01 if weight_decay is None else weight_decay, amsgrad=bool(amsgrad))
    raise ValueError(f"optimizer must be None, 'sgd', 'momentum', 'adam', 'adamw' or a torch.optim.SGD, Adam or "
                     f"AdamW, not {kind!r}")


def kind_of(opt):
    """Kiln's optimizer kind for a torch.optim optimizer, or KilnError for one Kiln does not compile."""
    import torch

    cls = type(opt)
    if cls is torch.optim.SGD:
        return "momentum" if any(g.get("momentum", 0) for g in opt.param_groups) else "sgd"
    if cls is torch.optim.Adam:
        return "adam"
    if cls is torch.optim.AdamW:
        return "adamw"
    raise KilnError(f"the optimizer is a {cls.__module__}.{cls.__qualname__}: Kiln compiles torch.optim.SGD, Adam "
                    "and AdamW (or give their names, 'sgd', 'momentum', 'adam', 'adamw')")


def plan(opt, named_params, max_grad_norm):
    """What the compiler needs of opt: (kind, the optimizer pass's options, {parameter name: group}, the
    groups as kiln.json keeps them). named_params are the module's (name, parameter) pairs; a parameter
    in no group (or not requiring a gradient) is not trained, as with torch.optim."""
    kind = kind_of(opt)
    by_id = {}
    for name, p in named_params:
        by_id.setdefault(id(p), name)
    groups = opt.param_groups
    first = groups[0]
    for k, g in enumerate(groups):
        if g.get("maximize"):
            raise KilnError(f"parameter group {k} has maximize=True, which Kiln does not compile")
        if g.get("differentiable"):
            raise KilnError(f"parameter group {k} has differentiable=True, which Kiln does not compile")
        if kind in ("sgd", "momentum") and g.get("dampening", 0):
            raise KilnError(f"parameter group {k} has dampening={g['dampening']}: Kiln compiles SGD without dampening")
        for flag in ("nesterov", "amsgrad"):
            if bool(g.get(flag, False)) != bool(first.get(flag, False)):
                raise KilnError(f"parameter group {k} has {flag}={g.get(flag)} and group 0 {flag}={first.get(flag)}: "
                                f"Kiln compiles one {flag} for every group")
        if g.get("nesterov") and not g.get("momentum"):
            raise KilnError(f"parameter group {k} has nesterov=True and no momentum")
    group_of, saved = {}, []
    for k, g in enumerate(groups):
        names = []
        for i, p in enumerate(g["params"]):
            name = by_id.get(id(p))
            if name is None:
                raise KilnError(f"parameter {i} of the optimizer's group {k} (shape {list(p.shape)}) is not a parameter "
                                "of the module")
            if name in group_of:
                raise KilnError(f"parameter {name} is in two of the optimizer's groups")
            names.append(name)
            if p.requires_grad:
                group_of[name] = k
        saved.append({"params": names, **{key: plain(v) for key, v in g.items() if key != "params"}})

    def options(g):
        o = {"lr": float(g["lr"]), "weight-decay": float(g.get("weight_decay", 0.0))}
        if kind == "momentum":
            o["momentum"] = float(g.get("momentum", 0.0))
        if kind in ("adam", "adamw"):
            o["beta1"], o["beta2"] = (float(b) for b in g["betas"])
            o["eps"] = float(g["eps"])
        return o

    opts = [f"{key}={v!r}" for key, v in options(first).items()]
    if first.get("nesterov"):
        opts.append("nesterov=true")
    if first.get("amsgrad"):
        opts.append("amsgrad=true")
    if max_grad_norm is not None:
        if not (float(max_grad_norm) > 0):
            raise ValueError(f"max_grad_norm must be above 0, not {max_grad_norm!r}")
        opts.append(f"max-grad-norm={float(max_grad_norm)!r}")
    if len(groups) > 1:
        opts.append("groups=" + ";".join(":".join(f"{key}:{v!r}" for key, v in options(g).items()) for g in groups[1:]))
    return kind, ",".join(opts), group_of, saved


def plain(v):
    """A param_groups value as JSON keeps it."""
    if isinstance(v, (tuple, list)):
        return [plain(x) for x in v]
    if hasattr(v, "item"):
        return v.item()
    return v


def rebuild(kind, groups, params):
    """The optimizer of a step reopened from a checkpoint: kind's torch.optim class over groups (as plan
    returned them, the hyper-parameters as Step.save found them), params giving each name's parameter."""
    import torch

    cls = {"sgd": torch.optim.SGD, "momentum": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[kind]
    torch_groups = []
    for g in groups:
        tg = {k: (tuple(v) if k == "betas" else v) for k, v in g.items() if k != "params"}
        tg["params"] = [params[n] for n in g["params"] if n in params]
        torch_groups.append(tg)
    return cls(torch_groups)


def _noop_step(self, closure=None):
    """The compiled step updates the parameters; this step does nothing (but evaluate closure)."""
    if closure is None:
        return None
    import torch
    with torch.enable_grad():
        return closure()


class Binding:
    """Ties a torch.optim optimizer to a step's runtime: hyper-parameters in, state as views."""

    def __init__(self, opt, kind, rt, param_names, prefix):
        """param_names maps each trained parameter of opt (by id) to its module name; the runtime holds it
        as prefix + name. The optimizer's state becomes views of the step's (whose values stay), its
        hyper-parameters the step's from its next call on."""
        self.opt, self.kind, self.rt, self.prefix = opt, kind, rt, prefix
        self.names = param_names
        amsgrad = bool(opt.param_groups[0].get("amsgrad"))
        self.keys = dict(_STATE[kind], **(_AMSGRAD if amsgrad else {}))
        self.written = {}  # Kiln state name -> the value last written
        self.fixed = [{k: g.get(k) for k in _FIXED[kind]} for g in opt.param_groups]
        self.views = {}  # id(param) -> {torch key: view}
        self.step_view = None
        # The step's own step(): the compiled step updates, and schedulers see it count (their wrappers
        # are not needed: the step increments the counters they read).
        fn = types.FunctionType(_noop_step.__code__, _noop_step.__globals__, "step")
        fn.__doc__ = _noop_step.__doc__
        fn._with_counter = True  # torch 1.x's lr_scheduler: opt.step counts already
        fn._wrapped_by_lr_sched = True  # torch 2.x's
        opt.step = types.MethodType(fn, opt)
        views, step_view = self.state_views()
        for g in opt.param_groups:
            for p in g["params"]:
                if views.get(id(p)):
                    opt.state[p].update(views[id(p)])
                    if step_view is not None:
                        opt.state[p]["step"] = step_view

    def _state_name(self, base, k):
        return base if k == 0 else f"{base}.{k}"

    def hyper_in(self):
        """Copies the groups' hyper-parameters that changed into the step; refuses a change of one
        compiled into it."""
        import numpy as np

        for k, g in enumerate(self.opt.param_groups):
            if k < len(self.fixed):
                for key, was in self.fixed[k].items():
                    if g.get(key) != was:
                        raise KilnError(f"the optimizer's group {k} changed {key} from {was} to {g.get(key)}: it is "
                                        "compiled into the step (compile again to change it)")
            elif g.get("params"):
                raise KilnError(f"the optimizer has a group {k} that the step was not compiled with (add_param_group): "
                                "compile again with it")
            for key, names in _HYPER[self.kind].items():
                vals = g[key]
                pairs = zip(names, vals) if isinstance(names, tuple) else [(names, vals)]
                for n, v in pairs:
                    name = self._state_name(n, k)
                    v = float(v)
                    if self.written.get(name) != v:
                        t = self.rt.by_name.get(name)
                        if t is None:
                            continue  # a group without trained parameters
                        self.rt.set(t, np.asarray(v))
                        self.written[name] = v

    def state_views(self):
        """{id(param): {torch key: torch view of the step's tensor}} and the step count's view."""
        import torch

        if self.step_view is None:
            # torch.optim's Adam keeps a per-parameter "step"; SGD none.
            t = self.rt.by_name.get("optimizer.step") if self.kind in ("adam", "adamw") else None
            self.step_view = torch.from_numpy(self.rt.view(t)) if t else None
            for g in self.opt.param_groups:
                for p in g["params"]:
                    name = self.names.get(id(p))
                    if name is None:
                        continue
                    views = {}
                    for key, base in self.keys.items():
                        t = self.rt.by_name.get(base + self.prefix + name)
                        if t is not None:
                            views[key] = torch.from_numpy(self.rt.view(t))
                    self.views[id(p)] = views
        return self.views, self.step_view

    def state_in(self):
        """Makes the optimizer's state the step's: an entry that is not the step's view (after
        optimizer.load_state_dict, or a fresh optimizer) is copied into the step, then replaced by the
        view. A parameter with no state (torch's state before its first step) has its state zeroed."""
        import numpy as np

        views, step_view = self.state_views()
        steps = set()
        for g in self.opt.param_groups:
            for p in g["params"]:
                if id(p) not in views:
                    continue
                st = self.opt.state[p]
                mine = views[id(p)]
                if not st:
                    for v in mine.values():
                        v.zero_()
                    if step_view is not None and mine:
                        steps.add(0.0)
                for key, view in mine.items():
                    cur = st.get(key)
                    if cur is view:
                        continue
                    if cur is not None and cur.data_ptr() != view.data_ptr():
                        a = cur.detach().cpu()
                        if list(a.shape) != list(view.shape):
                            raise KilnError(f"the optimizer's {key} of {self.names[id(p)]} has shape {list(a.shape)}, "
                                            f"the step's {list(view.shape)}")
                        view.copy_(a)
                    st[key] = view
                if step_view is not None and mine:
                    cur = st.get("step")
                    if cur is not step_view:
                        if cur is not None:
                            steps.add(float(cur))
                        st["step"] = step_view
        if len(steps) > 1:
            raise KilnError(f"the optimizer's parameters have taken different numbers of steps ({sorted(steps)}): the "
                            "step keeps one count")
        if steps and step_view is not None:
            step_view.fill_(steps.pop())

    def stepped(self):
        """Counts one optimizer step for the schedulers (torch 1.x reads _step_count, 2.x _opt_called)."""
        self.opt._step_count = getattr(self.opt, "_step_count", 0) + 1
        self.opt._opt_called = True

    def unshare(self):
        """Gives the optimizer copies of the views (the step is about to go)."""
        for g in self.opt.param_groups:
            for p in g["params"]:
                st = self.opt.state.get(p)
                if not st:
                    continue
                for key, v in list(st.items()):
                    if hasattr(v, "clone"):
                        st[key] = v.clone()
        self.views, self.step_view = {}, None
