"""A program whose evaluation hangs on global 0 and raises on later globals: the run must train on regardless."""

import time, zlib, torch, torch.nn.functional as F
import crosscloud.sdk as cc

FAMILY = "byte-lm"
EVAL_BATCHES = 2                        # run.eval_batches: how much of the held-out set evaluate may read

def build_model(args):
    torch.manual_seed(args["seed"])
    return torch.nn.Embedding(256, 256)

def _data(files):
    return torch.frombuffer(bytearray(b"".join(f.read_bytes() for f in files)), dtype=torch.uint8).long()

def _loss(model, data, starts):
    pairs = torch.stack([data[s:s + 65] for s in starts.tolist()])
    return F.cross_entropy(model(pairs[:, :-1]).reshape(-1, 256), pairs[:, 1:].reshape(-1))

def evaluate(model, run):
    assert run.eval_batches == EVAL_BATCHES
    if model.weight.grad is None and not getattr(evaluate, "called", False):
        evaluate.called = True
        time.sleep(3600)                # global 0: hangs past the job's eval_timeout_s
    raise RuntimeError("the held-out set is unreadable")

if __name__ == "__main__":
    run = cc.init()
    model = build_model(run.args).to(run.device)
    opt = torch.optim.SGD(model.parameters(), lr=run.args["lr"])
    step = run.resume(model, opt)
    data = _data(run.data_files()).to(run.device)
    with cc.DiLoCo(run, model, opt) as diloco:
        while not diloco.done:
            gen = torch.Generator().manual_seed(zlib.crc32(f"{run.cloud}/{run.rank}/{step}".encode()))
            loss = _loss(model, data, torch.randint(0, len(data) - 66, (run.batch_size,), generator=gen))
            loss.backward(); opt.step(); opt.zero_grad()
            diloco.step(loss=loss)
            step += 1
