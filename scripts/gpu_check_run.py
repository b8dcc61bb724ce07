"""The device check's run (scripts/gpu_check.sh run DIR): on the GPU machine, over what
`gpu_check.sh prepare DIR` wrote, builds each CUDA program (DIR/NAME/build.sh, nvcc, in parallel),
runs it, compares its results with the interpreter's under the bounds manifest.json gives, checks
the device memory it used against its plan, times the timing programs against PyTorch eager on the
same GPU (scripts/gpu_check_torch.py), and writes DIR/gpu_check.json. Exit status 0 when every
check passed.

Usage: gpu_check_run.py DIR [--emulate DIR_WITH_kiln_cuda_emulate.h] [--jobs N]
With --emulate (Kiln's tests, on a machine without a GPU) the programs are built as their CPU
emulation and only the correctness cases run. Needs numpy (and PyTorch for the timing)."""
import argparse, concurrent.futures, datetime, json, os, re, subprocess, sys, time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DEVICE_LINE = re.compile(r"device: (\d+) bytes allocated, (-?\d+) bytes measured \(cudaMemGetInfo\), (\d+) bytes planned, (\d+) bytes of library workspace")
TIME_LINE = re.compile(r"(\d+) runs, ([0-9.eE+-]+) seconds per run")


# Limits per command: the device tool runs one command for at most 10 minutes.
BUILD_SECONDS, RUN_SECONDS, TORCH_SECONDS = 300, 120, 180


def build(folder, emulate):
    env = dict(os.environ)
    if emulate:
        env["KILN_CUDA_EMULATE"] = os.path.abspath(emulate)
        env.setdefault("CC", "clang-14")
        env.setdefault("CXX", "clang++-14")
    t0 = time.time()
    try:
        p = subprocess.run(["sh", os.path.join(folder, "build.sh")], env=env, capture_output=True, text=True, timeout=BUILD_SECONDS)
    except subprocess.TimeoutExpired:
        return {"ok": False, "seconds": round(time.time() - t0, 1), "log": "build.sh ran past %d s" % BUILD_SECONDS}
    return {"ok": p.returncode == 0, "seconds": round(time.time() - t0, 1), "log": (p.stdout + p.stderr)[-4000:]}


def run(folder, args):
    try:
        p = subprocess.run([os.path.join(folder, "step")] + args, capture_output=True, text=True, timeout=RUN_SECONDS)
    except subprocess.TimeoutExpired:
        return -1, "the program ran past %d s" % RUN_SECONDS
    return p.returncode, p.stderr


def memory(stderr):
    m = DEVICE_LINE.search(stderr)
    if not m:
        return None
    own, measured, planned, workspace = (int(x) for x in m.groups())
    # measured also holds what cuBLAS's handle and the graph allocate for themselves: reported, not judged.
    return {"allocated": own, "measured": measured, "planned": planned, "library_workspace": workspace,
            "allocated_ok": own <= planned + workspace, "measured_within_plan": measured <= planned + workspace}


def relerr(got, want):
    """Normwise relative error; NaNs must sit in the same places and are left out."""
    got, want = got.astype(np.float64).ravel(), want.astype(np.float64).ravel()
    gn, wn = np.isnan(got), np.isnan(want)
    if (gn != wn).any():
        return float("inf")
    d = got[~wn] - want[~wn]
    den = np.linalg.norm(want[~wn])
    return float(np.linalg.norm(d) / den) if den > 0 else float(np.linalg.norm(d))


def guarded(fn, name, *args):
    """fn's report, or a failed one naming the exception: one case never loses the others."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - every failure is a result to report
        return {"name": name, "ok": False, "error": "%s: %s" % (type(e).__name__, e)}


def correctness(root, case, emulate):
    folder = os.path.join(root, case["name"])
    res = {"name": case["name"], "build": build(folder, emulate)}
    if not res["build"]["ok"]:
        res["ok"] = False
        return res
    out = os.path.join(folder, "out")
    code, stderr = run(folder, ["--inputs", os.path.join(folder, "in"), "--output-dir", out, "--steps", "1", "--report-memory"])
    res["exit"], res["memory"] = code, memory(stderr)
    if code != 0:
        res["ok"], res["stderr"] = False, stderr[-2000:]
        return res
    outputs = []
    for o in case["outputs"]:
        got, want = np.load(os.path.join(out, o["file"])), np.load(os.path.join(folder, "ref", o["file"]))
        if o.get("initial"):
            init = np.load(os.path.join(folder, "in", o["initial"])).astype(np.float64)
            got, want = got.astype(np.float64) - init, want.astype(np.float64) - init
        e = relerr(got, want)
        outputs.append({"file": o["file"], "error": e, "bound": o["bound"], "ok": e <= o["bound"]})
    res["outputs"] = outputs
    res["ok"] = all(o["ok"] for o in outputs) and res["memory"] is not None and res["memory"]["allocated_ok"]
    return res


def timing(root, case, built):
    folder = os.path.join(root, case["name"])
    res = {"name": case["name"], "precision": case["precision"], "build": built}
    if not built["ok"]:
        res["ok"] = False
        return res
    secs = {}
    for steps in (2, 12):
        code, stderr = run(folder, ["--seed", "1", "--steps", str(steps), "--report-time", "--report-memory", "--output-dir", os.path.join(folder, "out")])
        m = TIME_LINE.search(stderr)
        if code != 0 or not m:
            res["ok"], res["stderr"] = False, stderr[-2000:]
            return res
        secs[steps] = float(m.group(2))
        res["memory"] = memory(stderr)
        # A CUDA that cannot capture a cooperative launch runs the nodes
        # directly (the runtime says so): the timing then includes each
        # launch's issue.
        res["graph"] = "could not be captured into a CUDA graph" not in stderr
    # The first step captures the graph: the difference of two runs is the steady step.
    res["kiln_seconds"] = (12 * secs[12] - 2 * secs[2]) / 10
    try:
        p = subprocess.run([sys.executable, os.path.join(HERE, "gpu_check_torch.py"), case["torch"], str(case["batch"]), case["precision"]],
                           capture_output=True, text=True, timeout=TORCH_SECONDS)
        res["torch"] = json.loads(p.stdout.strip().splitlines()[-1])
    except subprocess.TimeoutExpired:
        res["torch"] = {"error": "PyTorch ran past %d s" % TORCH_SECONDS}
    except (ValueError, IndexError):
        res["torch"] = {"error": (p.stdout + p.stderr)[-2000:]}
    if "seconds" in res["torch"]:
        res["ratio"] = res["kiln_seconds"] / res["torch"]["seconds"]
        res["ok"] = res["ratio"] <= 1.5
    elif res["torch"].get("skipped"):
        res["ok"], res["skipped"] = True, res["torch"]["skipped"]  # nothing to compare with: reported, not failed
    else:
        res["ok"] = False
    return res


def device_name():
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--emulate", help="build the CPU emulation with kiln_cuda_emulate.h from this folder")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args()
    man = json.load(open(os.path.join(a.dir, "manifest.json")))
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "device": "emulated on the CPU" if a.emulate else device_name(),
              "prepared": man["prepared"], "correctness": [], "timing": []}
    t0 = time.time()
    def save():
        with open(os.path.join(a.dir, "gpu_check.json.tmp"), "w") as f:
            json.dump(report, f, indent=1)
        os.replace(os.path.join(a.dir, "gpu_check.json.tmp"), os.path.join(a.dir, "gpu_check.json"))

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        checks = [pool.submit(guarded, correctness, c["name"], a.dir, c, a.emulate) for c in man["correctness"]]
        builds = [] if a.emulate else [pool.submit(guarded, build, t["name"], os.path.join(a.dir, t["name"]), None) for t in man["timing"]]
        report["correctness"] = [c.result() for c in checks]
        save()
        built = [b.result() for b in builds]
    # Timed one at a time, after every build: nothing else runs on the GPU.
    for case, b in zip([] if a.emulate else man["timing"], built):
        report["timing"].append(guarded(timing, case["name"], a.dir, case, b))
        save()
    report["seconds"] = round(time.time() - t0, 1)
    report["ok"] = all(c["ok"] for c in report["correctness"]) and all(t["ok"] for t in report["timing"])
    save()
    for c in report["correctness"]:
        worst = max((o["error"] / o["bound"] for o in c.get("outputs", []) if o["bound"] > 0), default=float("nan"))
        print("%-22s %s  worst error/bound %.3g  %s" % (c["name"], "ok  " if c["ok"] else "FAIL", worst, c.get("error") or "build %.0f s" % c["build"]["seconds"]))
    for t in report["timing"]:
        print("%-22s %s  kiln %s s, torch %s s, ratio %s %s" % (t["name"], "ok  " if t["ok"] else "FAIL", t.get("kiln_seconds"), t.get("torch", {}).get("seconds"),
                                                            t.get("ratio"), t.get("skipped") or t.get("error") or ""))
    sys.exit(0 if report["ok"] else 1)


if __name__ == "__main__":
    main()
