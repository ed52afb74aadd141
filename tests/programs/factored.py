"""A program that names its registered model itself, and whose width is an argument its name leaves out."""

import zlib, torch, torch.nn.functional as F
import crosscloud.sdk as cc

FAMILY = "byte-lm"
MODEL_NAME = "factored-bigram"          # one registered model, whatever width run.args picks

def build_model(args):                  # a byte bigram through a bottleneck of args["width"]
    torch.manual_seed(args["seed"])
    return torch.nn.Sequential(torch.nn.Embedding(256, args.get("width", 32)), torch.nn.Linear(args.get("width", 32), 256))

def _data(files):
    return torch.frombuffer(bytearray(b"".join(f.read_bytes() for f in files)), dtype=torch.uint8).long()

def _loss(model, data, starts):
    pairs = torch.stack([data[s:s + 65] for s in starts.tolist()])
    return F.cross_entropy(model(pairs[:, :-1]).reshape(-1, 256), pairs[:, 1:].reshape(-1))

def evaluate(model, run):
    data = _data(run.eval_files())
    with torch.no_grad():
        return _loss(model, data.to(run.device), torch.randint(0, len(data) - 66, (32,), generator=torch.Generator().manual_seed(0))).item()

if __name__ == "__main__":
    run = cc.init()
    model = build_model(run.args).to(run.device)
    opt = torch.optim.Adam(model.parameters(), lr=run.args["lr"])
    step = run.resume(model, opt)
    data = _data(run.data_files()).to(run.device)
    with cc.DiLoCo(run, model, opt) as diloco:
        while not diloco.done:
            gen = torch.Generator().manual_seed(zlib.crc32(f"{run.cloud}/{run.rank}/{step}".encode()))
            loss = _loss(model, data, torch.randint(0, len(data) - 66, (run.batch_size,), generator=gen))
            loss.backward(); opt.step(); opt.zero_grad()
            diloco.step(loss=loss)
            step += 1
