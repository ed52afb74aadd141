"""A training program that lives outside crosscloud and uses only its documented SDK (docs/programs.md)."""

import zlib, torch, torch.nn.functional as F
import crosscloud.sdk as cc

FAMILY = "byte-lm"                      # the family whose adapted images the federation lists

def build_model(args):                  # the model every cloud starts from: deterministic in args
    torch.manual_seed(args["seed"])
    return torch.nn.Embedding(256, 256) # a byte bigram model: row b holds the logits of the next byte

def _data(files):
    return torch.frombuffer(bytearray(b"".join(f.read_bytes() for f in files)), dtype=torch.uint8).long()

def _loss(model, data, starts):
    pairs = torch.stack([data[s:s + 65] for s in starts.tolist()])
    return F.cross_entropy(model(pairs[:, :-1]).reshape(-1, 256), pairs[:, 1:].reshape(-1))

def evaluate(model, run):               # crosscloud calls it on the global model: the held-out loss
    data = _data(run.eval_files())
    with torch.no_grad():
        return _loss(model, data.to(run.device), torch.randint(0, len(data) - 66, (32,), generator=torch.Generator().manual_seed(0))).item()

if __name__ == "__main__":
    run = cc.init()                     # this sub-task's plan, cloud, rank, device, data and store
    model = build_model(run.args).to(run.device)
    opt = torch.optim.Adam(model.parameters(), lr=run.args["lr"])
    step = run.resume(model, opt)       # after a restart: this cloud's last state; the steps already trained
    data = _data(run.data_files()).to(run.device)
    with cc.DiLoCo(run, model, opt) as diloco:
        while not diloco.done:
            gen = torch.Generator().manual_seed(zlib.crc32(f"{run.cloud}/{run.rank}/{step}".encode()))
            loss = _loss(model, data, torch.randint(0, len(data) - 66, (run.batch_size,), generator=gen))
            loss.backward(); opt.step(); opt.zero_grad()
            diloco.step(loss=loss)      # every H steps: commit the pseudo-gradient, fold each global in
            step += 1
