"""The breadth zoo: small real models of every family users train, with weights, PyTorch's outputs and
the gradients of sum(output * w) for a fixed random w (a plain sum of a softmax or a normalised output is
constant, and its gradients are rounding noise). Batch 2, small inputs, opsets 13 to 17 and, for a few,
the old-opset path. Writes OUT/NAME/{model.onnx,input.npy,weight.npy,output.npy,grad.<param>.npy}.
Usage: export_breadth.py OUT_DIR"""
import math, os, sys, numpy as np, torch
import torch.nn as nn
import torch.nn.functional as F


class MobileNetish(nn.Module):
    """Inverted residuals: pointwise, depthwise 3x3 (ReLU6), pointwise; global pooling."""
    def __init__(self):
        super().__init__()
        def block(cin, cout, stride):
            return nn.Sequential(nn.Conv2d(cin, cin * 4, 1, bias=False), nn.BatchNorm2d(cin * 4), nn.ReLU6(),
                                 nn.Conv2d(cin * 4, cin * 4, 3, stride, 1, groups=cin * 4, bias=False),
                                 nn.BatchNorm2d(cin * 4), nn.ReLU6(), nn.Conv2d(cin * 4, cout, 1, bias=False),
                                 nn.BatchNorm2d(cout))
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU6())
        self.b1, self.b2 = block(8, 8, 1), block(8, 12, 2)
        self.fc = nn.Linear(12, 10)

    def forward(self, x):
        h = self.stem(x)
        h = h + self.b1(h)
        h = self.b2(h)
        return self.fc(F.adaptive_avg_pool2d(h, 1).flatten(1))


class GroupedCNN(nn.Module):
    """Grouped convolutions, LeakyReLU, PReLU, ELU, average and max pooling."""
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(4, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1, groups=4)
        self.p = nn.PReLU(8)
        self.fc = nn.Linear(8 * 2 * 2, 5)

    def forward(self, x):
        h = F.leaky_relu(self.c1(x), 0.1)
        h = F.max_pool2d(h, 2)
        h = F.elu(self.p(self.c2(h)))
        return self.fc(F.avg_pool2d(h, 2).flatten(1))


class DilatedSeg(nn.Module):
    """Segmentation head: dilated convolutions and bilinear upsampling back to the input size."""
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.c2 = nn.Conv2d(8, 8, 3, padding=2, dilation=2)
        self.c3 = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        h = F.relu(self.c2(F.relu(self.c1(x))))
        return F.interpolate(self.c3(h), scale_factor=2, mode="bilinear", align_corners=False)


class NearestUp(nn.Module):
    """Nearest-neighbour upsampling (FPN style) and a skip addition."""
    def __init__(self):
        super().__init__()
        self.down, self.lat, self.out = nn.Conv2d(4, 8, 3, 2, 1), nn.Conv2d(4, 8, 1), nn.Conv2d(8, 3, 3, padding=1)

    def forward(self, x):
        return self.out(self.lat(x) + F.interpolate(self.down(x), scale_factor=2, mode="nearest"))


class UNet(nn.Module):
    """Two levels: conv blocks, max pooling, transposed convolution and skip concatenation."""
    def __init__(self):
        super().__init__()
        def conv(cin, cout):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU())
        self.e1, self.e2 = conv(3, 8), conv(8, 16)
        self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.d1 = conv(16, 8)
        self.head = nn.Conv2d(8, 2, 1)

    def forward(self, x):
        a = self.e1(x)
        b = self.e2(F.max_pool2d(a, 2))
        return self.head(self.d1(torch.cat([a, self.up(b)], 1)))


class Video3D(nn.Module):
    """3-D convolutions over (time, height, width), 3-D pooling, a classifier."""
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv3d(3, 6, 3, padding=1)
        self.bn = nn.BatchNorm3d(6)
        self.c2 = nn.Conv3d(6, 8, (2, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1))
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        h = F.max_pool3d(F.relu(self.bn(self.c1(x))), (1, 2, 2))
        h = F.relu(self.c2(h))
        return self.fc(h.mean(dim=(2, 3, 4)))


class Audio1D(nn.Module):
    """1-D convolutions with GroupNorm (exported as InstanceNormalization), GELU, 1-D pooling."""
    def __init__(self):
        super().__init__()
        self.c1, self.g1 = nn.Conv1d(1, 8, 9, stride=2, padding=4), nn.GroupNorm(2, 8)
        self.c2, self.g2 = nn.Conv1d(8, 8, 5, padding=2), nn.GroupNorm(4, 8)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        h = F.gelu(self.g1(self.c1(x)))
        h = F.max_pool1d(F.gelu(self.g2(self.c2(h))), 2)
        return self.fc(F.avg_pool1d(h, 16).flatten(1))


class HFDecoder(nn.Module):
    """A decoder-only block in the HuggingFace style: fused qkv, split, causal mask by masked_fill,
    tanh GELU written out (NewGELU), pre-LayerNorm, tied-free head."""
    def __init__(self, vocab=40, d=32, heads=4, seq=8):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.ln1, self.ln2, self.lnf = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.head = nn.Linear(d, vocab)
        self.heads = heads
        self.register_buffer("mask", torch.tril(torch.ones(seq, seq)).view(1, 1, seq, seq))

    def forward(self, ids):
        b, t = ids.shape
        x = self.tok(ids) + self.pos(torch.arange(t).unsqueeze(0))
        q, k, v = self.qkv(self.ln1(x)).split(x.shape[-1], dim=2)
        hd = x.shape[-1] // self.heads
        q, k, v = (z.view(b, t, self.heads, hd).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        att = att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, -1))
        h = self.fc1(self.ln2(x))
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))
        return self.head(self.lnf(x + self.fc2(h)))


class EncoderDecoder(nn.Module):
    """nn.Transformer with one encoder and one decoder layer over embedded token ids."""
    def __init__(self, vocab=30, d=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.tf = nn.Transformer(d, 2, 1, 1, 32, dropout=0.0, batch_first=True)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        src = self.emb(ids)
        tgt = src.flip(1)
        return self.head(self.tf(src, tgt))


class Swinish(nn.Module):
    """Window attention with a cyclic shift (roll) and padding to whole windows."""
    def __init__(self, d=8, win=2):
        super().__init__()
        self.embed = nn.Conv2d(3, d, 2, 2)
        self.norm = nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.win, self.d = win, d
        self.head = nn.Linear(d, 5)

    def forward(self, x):
        h = self.embed(x).permute(0, 2, 3, 1)  # B, H, W, C with H = W = 3
        b, hh, ww, c = h.shape
        w = self.win
        h = F.pad(self.norm(h), (0, 0, 0, (w - ww % w) % w, 0, (w - hh % w) % w))
        h = torch.roll(h, shifts=(-1, -1), dims=(1, 2))
        H, W = h.shape[1], h.shape[2]
        win = h.view(b, H // w, w, W // w, w, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, w * w, c)
        q, k, v = self.qkv(win).chunk(3, dim=-1)
        a = ((q @ k.transpose(1, 2)) / math.sqrt(c)).softmax(-1) @ v
        out = self.proj(a).view(b, H // w, W // w, w, w, c).permute(0, 1, 3, 2, 4, 5).reshape(b, H, W, c)
        out = torch.roll(out, shifts=(1, 1), dims=(1, 2))[:, :hh, :ww, :]
        return self.head(out.mean(dim=(1, 2)))


class ConvNeXtish(nn.Module):
    """A ConvNeXt block: depthwise 7x7, channels-last LayerNorm, GELU MLP, layer scale."""
    def __init__(self, d=16):
        super().__init__()
        self.stem = nn.Conv2d(3, d, 4, 4)
        self.dw = nn.Conv2d(d, d, 7, padding=3, groups=d)
        self.norm = nn.LayerNorm(d)
        self.pw1, self.pw2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.gamma = nn.Parameter(torch.full((d,), 0.5))
        self.head = nn.Linear(d, 6)

    def forward(self, x):
        h = self.stem(x)
        y = self.dw(h).permute(0, 2, 3, 1)
        y = self.gamma * self.pw2(F.gelu(self.pw1(self.norm(y))))
        h = h + y.permute(0, 3, 1, 2)
        return self.head(h.mean(dim=(2, 3)))


class EfficientNetish(nn.Module):
    """MBConv with SiLU and squeeze-and-excitation; HardSwish and Mish heads."""
    def __init__(self, d=8):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, d, 3, 2, 1), nn.BatchNorm2d(d), nn.SiLU())
        self.dw = nn.Sequential(nn.Conv2d(d, d, 3, padding=1, groups=d), nn.BatchNorm2d(d), nn.SiLU())
        self.se1, self.se2 = nn.Conv2d(d, 2, 1), nn.Conv2d(2, d, 1)
        self.fc1, self.fc2 = nn.Linear(d, 16), nn.Linear(16, 4)

    def forward(self, x):
        h = self.dw(self.stem(x))
        s = torch.sigmoid(self.se2(F.silu(self.se1(F.adaptive_avg_pool2d(h, 1)))))
        h = (h * s).mean(dim=(2, 3))
        return self.fc2(F.mish(F.hardswish(self.fc1(h))))


class ViTTiny(nn.Module):
    """Patch embedding, class token, position embedding, two encoder layers (GELU), LayerNorm."""
    def __init__(self, d=16):
        super().__init__()
        self.patch = nn.Conv2d(3, d, 4, 4)
        self.cls = nn.Parameter(torch.randn(1, 1, d) * 0.1)
        self.pos = nn.Parameter(torch.randn(1, 5, d) * 0.1)
        layer = nn.TransformerEncoderLayer(d, 2, 32, dropout=0.0, activation="gelu", batch_first=True, norm_first=True)
        self.enc = nn.TransformerEncoder(layer, 2)
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, 7)

    def forward(self, x):
        p = self.patch(x).flatten(2).transpose(1, 2)
        h = torch.cat([self.cls.expand(x.shape[0], -1, -1), p], 1) + self.pos
        return self.head(self.norm(self.enc(h))[:, 0])


class StyleNet(nn.Module):
    """Style transfer: reflection and replication padding, InstanceNorm, a residual block,
    transposed convolution, tanh."""
    def __init__(self):
        super().__init__()
        self.c1, self.n1 = nn.Conv2d(3, 8, 3, stride=2), nn.InstanceNorm2d(8, affine=True)
        self.r1, self.rn = nn.Conv2d(8, 8, 3), nn.InstanceNorm2d(8, affine=True)
        self.up = nn.ConvTranspose2d(8, 3, 3, stride=2, padding=1, output_padding=1)

    def forward(self, x):
        h = F.relu(self.n1(self.c1(F.pad(x, (1, 1, 1, 1), mode="reflect"))))
        h = h + self.rn(self.r1(F.pad(h, (1, 1, 1, 1), mode="replicate")))
        return torch.tanh(self.up(h))


class Activations(nn.Module):
    """Every elementwise activation and reduction PyTorch users reach for."""
    def __init__(self):
        super().__init__()
        self.l1, self.l2, self.l3 = nn.Linear(6, 12), nn.Linear(12, 12), nn.Linear(12, 4)

    def forward(self, x):
        h = self.l1(x)
        h = F.selu(h) + F.softplus(h) + F.softsign(h) + F.hardsigmoid(h) + torch.clamp(h, -0.5, 0.5)
        h = self.l2(h)
        h = torch.sin(h) * torch.cos(h) + F.celu(h) + torch.where(h > 0.1, h, 0.1 * h)
        mx, mn = h.amax(dim=1, keepdim=True), h.amin(dim=1, keepdim=True)
        h = h + torch.logsumexp(h, dim=1, keepdim=True) + h.norm(dim=1, keepdim=True) + mx - mn
        return self.l3(h.repeat(1, 1)) + torch.floor(x[:, :4]) * 0.0


class RecurrentLM(nn.Module):
    """An LSTM language model over embedded token ids."""
    def __init__(self, cell, vocab=30, d=12, hidden=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.rnn = cell(d, hidden, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, ids):
        out, _ = self.rnn(self.emb(ids))
        return self.head(out)


class MLPOld(nn.Module):
    """An MLP with dropout (off) and log-softmax over a 2-D input, for opsets 7 and 9."""
    def __init__(self):
        super().__init__()
        self.l1, self.l2 = nn.Linear(10, 16), nn.Linear(16, 5)

    def forward(self, x):
        return F.log_softmax(self.l2(torch.tanh(self.l1(x))), dim=1)


class ASPP(nn.Module):
    """DeepLab's atrous pyramid: parallel dilated convolutions, image pooling, align_corners upsampling."""
    def __init__(self, d=8):
        super().__init__()
        self.stem = nn.Conv2d(3, d, 3, 2, 1)
        self.b = nn.ModuleList([nn.Conv2d(d, 4, 3, padding=r, dilation=r) for r in (1, 2, 3)])
        self.pool = nn.Conv2d(d, 4, 1)
        self.out = nn.Conv2d(16, 3, 1)

    def forward(self, x):
        h = F.relu(self.stem(x))
        p = F.interpolate(self.pool(F.adaptive_avg_pool2d(h, 1)), size=h.shape[2:], mode="bilinear", align_corners=True)
        y = self.out(torch.cat([F.relu(b(h)) for b in self.b] + [p], 1))
        return F.interpolate(y, scale_factor=2, mode="bilinear", align_corners=True)


class SuperRes(nn.Module):
    """ESPCN: convolutions and a pixel shuffle (depth to space)."""
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(1, 8, 5, padding=2), nn.Conv2d(8, 4, 3, padding=1)
        self.shuffle = nn.PixelShuffle(2)

    def forward(self, x):
        return self.shuffle(self.c2(torch.tanh(self.c1(x))))


class Encoder(nn.Module):
    """A post-norm ReLU transformer encoder over embedded ids with a mean-pooled classifier."""
    def __init__(self, vocab=25, d=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, 4, 32, dropout=0.0, batch_first=True), 2)
        self.head = nn.Linear(d, 3)

    def forward(self, ids):
        return self.head(self.enc(self.emb(ids)).mean(1))


class Tagger(nn.Module):
    """A two-layer bidirectional LSTM tagger."""
    def __init__(self, vocab=20, d=8, hidden=6):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.rnn = nn.LSTM(d, hidden, num_layers=2, bidirectional=True, batch_first=True)
        self.head = nn.Linear(2 * hidden, 4)

    def forward(self, ids):
        return self.head(self.rnn(self.emb(ids))[0])


class IndexingOps(nn.Module):
    """Scans, masks and indices: cumsum, triu/tril, argmax through one_hot, prod, mean of several, max pool."""
    def __init__(self):
        super().__init__()
        self.l1, self.l2 = nn.Linear(6, 5), nn.Linear(5, 5)

    def forward(self, x):
        h = torch.tanh(self.l1(x))                                      # [2, 5]
        sq = h.unsqueeze(2) * h.unsqueeze(1)                            # [2, 5, 5]
        a = torch.triu(sq, 1).sum(2) + torch.tril(sq).sum(1)
        b = torch.cumsum(h, 1) + torch.cumsum(h.flip(1), 1).flip(1)
        pick = F.one_hot(h.argmax(1), 5).float() * h + F.one_hot(h.argmin(1), 5).float()
        p = (h + 1.5).prod(1, keepdim=True)
        return self.l2(a + b + pick + p)


class AlexNetish(nn.Module):
    """AlexNet's local response normalisation between convolutions and max pooling."""
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)
        self.lrn = nn.LocalResponseNorm(3, alpha=1e-2, beta=0.75, k=2.0)
        self.fc = nn.Linear(8 * 4 * 4, 5)

    def forward(self, x):
        h = F.max_pool2d(self.lrn(F.relu(self.c1(x))), 2)
        h = F.max_pool2d(self.lrn(F.relu(self.c2(h))), 2)
        return self.fc(h.flatten(1))


class EinsumAttention(nn.Module):
    """Attention written with einsum (batched contractions, an outer product, a trace-free sum)."""
    def __init__(self, d=8, heads=2):
        super().__init__()
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, 4)
        self.heads, self.scale = heads, nn.Parameter(torch.ones(d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        att = torch.einsum("bqhd,bkhd->bhqk", q, k).softmax(-1)
        y = torch.einsum("bhqk,bkhd->bqhd", att, v).reshape(b, t, d)
        y = y + torch.einsum("btd,d->bt", y, self.scale).unsqueeze(-1) * 0.1
        return self.out(torch.einsum("...d,d->...d", y, self.scale))


class GatherScatter(nn.Module):
    """torch.gather, scatter_add / scatter (GatherElements, ScatterElements), topk, and advanced
    indexing read and written (GatherND, ScatterND)."""
    def __init__(self):
        super().__init__()
        self.l1, self.l2 = nn.Linear(6, 6), nn.Linear(6, 3)
        self.register_buffer("idx", torch.tensor([[2, 0, 1, 5, 4, 3], [1, 1, 0, 0, 2, 2]]))
        self.register_buffer("perm", torch.tensor([[5, 4, 3, 2, 1, 0], [0, 2, 4, 1, 3, 5]]))
        self.register_buffer("rows", torch.tensor([1, 0, 1]))
        self.register_buffer("cols", torch.tensor([0, 1, 1]))

    def forward(self, x):
        h = torch.tanh(self.l1(x))
        g = torch.gather(h, 1, self.idx)
        s = torch.zeros_like(h).scatter_add(1, self.idx, g * 2.0)
        p = h.scatter(1, self.perm, g)
        top, where = torch.topk(h, 3, dim=1)
        low = torch.topk(h, 2, dim=1, largest=False).values
        picked = torch.zeros_like(h).scatter_add(1, where, top)
        cube = h.view(2, 2, 3)
        nd = cube[self.rows, self.cols]                       # advanced indexing: GatherND
        put = cube.index_put((self.rows, self.cols), nd * 3.0)  # ScatterND
        return self.l2(g + s + p + picked + put.view(2, 6)) + low.sum(1, keepdim=True) + nd.sum()


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d) + 0.1 * torch.randn(d)), eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class LlamaBlock(nn.Module):
    """A LLaMA-style block: RMSNorm (written out), causal attention, SwiGLU MLP."""
    def __init__(self, vocab=32, d=16, heads=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.gate, self.up, self.down = nn.Linear(d, 32, bias=False), nn.Linear(d, 32, bias=False), nn.Linear(32, d, bias=False)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        x = self.emb(ids)
        h = self.n1(x)
        t = ids.shape[1]
        mask = torch.triu(torch.full((t, t), float("-inf")), 1)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        h = self.n2(x)
        x = x + self.down(F.silu(self.gate(h)) * self.up(h))
        return self.head(x)


class RNNSpeech(nn.Module):
    """A speech model on nn.RNN: two batch-first tanh layers, one bidirectional ReLU layer, a classifier
    per frame."""
    def __init__(self, feats=8, hidden=12, classes=5):
        super().__init__()
        self.rnn = nn.RNN(feats, hidden, num_layers=2, batch_first=True)
        self.relu_rnn = nn.RNN(hidden, hidden, nonlinearity="relu", bidirectional=True)
        self.out = nn.Linear(2 * hidden, classes)

    def forward(self, x):
        h, _ = self.rnn(x)
        h, _ = self.relu_rnn(h.transpose(0, 1))
        return self.out(h.transpose(0, 1))


class GPTByteMask(HFDecoder):
    """HFDecoder whose causal-mask buffer is uint8, as GPT-2 ports keep it (torch.tril of a byte
    tensor), compared with == 0 for masked_fill."""
    def __init__(self, vocab=40, d=32, heads=4, seq=8):
        super().__init__(vocab, d, heads, seq)
        self.register_buffer("mask", torch.tril(torch.ones(seq, seq, dtype=torch.uint8)).view(1, 1, seq, seq))


class Video2Plus1D(nn.Module):
    """(2+1)-D convolutions (R(2+1)D): a spatial 1x3x3 then a temporal 3x1x1 convolution per block,
    batch norm and ReLU, 3-D average pooling, a classifier."""
    def __init__(self, c=3, mid=8, out=12, classes=4):
        super().__init__()
        def block(i, m, o, stride=1):
            return nn.Sequential(
                nn.Conv3d(i, m, (1, 3, 3), stride=(1, stride, stride), padding=(0, 1, 1), bias=False),
                nn.BatchNorm3d(m), nn.ReLU(),
                nn.Conv3d(m, o, (3, 1, 1), stride=(stride, 1, 1), padding=(1, 0, 0), bias=False),
                nn.BatchNorm3d(o), nn.ReLU())
        self.b1, self.b2 = block(c, mid, out), block(out, mid, out, stride=2)
        self.fc = nn.Linear(out, classes)

    def forward(self, x):
        h = self.b2(self.b1(x))
        return self.fc(h.mean(dim=(2, 3, 4)))


def image(c=3, s=16):
    return lambda: torch.randn(2, c, s, s)


def tokens(vocab, seq=8):
    return lambda: torch.randint(0, vocab, (2, seq))


# name: (constructor, input, opset)
BREADTH = {
    "alexnetish": (AlexNetish, image(3, 16), 13),
    "einsum_attention": (EinsumAttention, lambda: torch.randn(2, 5, 8), 13),
    "gather_scatter": (GatherScatter, lambda: torch.randn(2, 6), 16),
    "llama_block": (LlamaBlock, tokens(32, 6), 14),
    "mobilenetish": (MobileNetish, image(), 13),
    "mobilenetish_opset9": (MobileNetish, image(), 9),
    "grouped_cnn": (GroupedCNN, image(4, 8), 14),
    "dilated_seg": (DilatedSeg, image(), 17),
    "nearest_up": (NearestUp, image(4, 8), 13),
    "unet": (UNet, image(), 16),
    "video3d": (Video3D, lambda: torch.randn(2, 3, 4, 8, 8), 13),
    "audio1d": (Audio1D, lambda: torch.randn(2, 1, 64), 15),
    "audio1d_opset11": (Audio1D, lambda: torch.randn(2, 1, 64), 11),
    "hf_decoder": (HFDecoder, tokens(40), 14),
    "hf_decoder_opset11": (HFDecoder, tokens(40), 11),
    "encoder_decoder": (EncoderDecoder, tokens(30, 6), 14),
    "swinish": (Swinish, image(3, 6), 13),
    "convnextish": (ConvNeXtish, image(3, 16), 13),
    "efficientnetish": (EfficientNetish, image(), 13),
    "efficientnetish_opset17": (EfficientNetish, image(), 17),
    "vit_tiny": (ViTTiny, image(3, 8), 14),
    "vit_tiny_opset17": (ViTTiny, image(3, 8), 17),
    "stylenet": (StyleNet, image(3, 12), 13),
    "activations": (Activations, lambda: torch.randn(2, 6), 13),
    "lstm_lm": (lambda: RecurrentLM(nn.LSTM), tokens(30, 5), 13),
    "indexing_ops": (IndexingOps, lambda: torch.randn(2, 6), 14),
    "bilstm_tagger": (Tagger, tokens(20, 5), 14),
    "mlp_opset7": (MLPOld, lambda: torch.randn(2, 10), 7),
    "mlp_opset9": (MLPOld, lambda: torch.randn(2, 10), 9),
    "aspp": (ASPP, image(3, 16), 13),
    "superres": (SuperRes, image(1, 8), 13),
    "encoder": (Encoder, tokens(25, 6), 13),
    "gru_lm": (lambda: RecurrentLM(nn.GRU), tokens(30, 5), 13),
    "rnn_speech": (RNNSpeech, lambda: torch.randn(2, 7, 8), 14),
    "gpt_byte_mask": (GPTByteMask, tokens(40), 14),
    "video_2plus1d": (Video2Plus1D, lambda: torch.randn(2, 3, 4, 8, 8), 13),
}

# Exported with a symbolic batch (dynamic_axes) at batch 2; the reference data is at batch 3, so that
# importing with --batch 3 must re-derive every shape computed from the batch.
DYNAMIC = {
    "hf_decoder_dynamic": (HFDecoder, tokens(40), 14),
    "vit_tiny_dynamic": (ViTTiny, image(3, 8), 14),
    "encoder_decoder_dynamic": (EncoderDecoder, tokens(30, 6), 14),
}

def instances(only=()):
    """Yields (name, model in training mode, example input, opset) for each model (those in only, when
    given), seeded as the committed data was made."""
    for name, (ctor, make_input, opset) in list(BREADTH.items()) + list(DYNAMIC.items()):
        if only and name not in only:
            continue
        torch.manual_seed(0)
        model = ctor()
        model.train()
        yield name, model, make_input(), opset


if __name__ == "__main__":
    out = sys.argv[1]
    for name, model, x, opset in instances(set(sys.argv[2:])):
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        dynamic = {"input": {0: "batch"}, "output": {0: "batch"}} if name in DYNAMIC else None
        try:
            torch.onnx.export(model, x, os.path.join(d, "model.onnx"), export_params=True, opset_version=opset,
                              training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                              input_names=["input"], output_names=["output"], dynamic_axes=dynamic)
            if dynamic:
                x = torch.cat([x, x[:1]], 0)  # batch 3
        except Exception as e:  # noqa: BLE001 - report and go on with the others
            print(name, "FAILED to export:", str(e).splitlines()[0])
            continue
        y = model(x)
        w = torch.randn(y.shape, generator=torch.Generator().manual_seed(1))
        (y * w).sum().backward()
        np.save(os.path.join(d, "input.npy"), x.numpy())
        np.save(os.path.join(d, "weight.npy"), w.numpy())
        np.save(os.path.join(d, "output.npy"), y.detach().numpy())
        for pname, p in model.named_parameters():
            if p.grad is not None:
                np.save(os.path.join(d, f"grad.{pname}.npy"), p.grad.numpy())
        print(name, "exported")
