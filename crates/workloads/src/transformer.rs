//! A GPT-style decoder trained with AdamW, as PyTorch eager mode allocates for it.

use crate::program::{Program, Tensor};
use crate::{Params, WorkloadError};
use allocsim_core::{Op, MIB};

/// `transformer-train`: `steps` training steps of a `layers`-deep decoder of width `hidden`
/// on `batch` sequences of `seq` tokens.
///
/// Lifetimes follow PyTorch eager mode with `zero_grad(set_to_none=True)` (the default):
/// - weights (fp32, `param_bytes` each) are allocated once and live to the end;
/// - each layer's forward saves its inputs and outputs for backward (layer-norm inputs and
///   statistics, the qkv projection, attention output and log-sum-exp with fused attention, or
///   the `seq x seq` softmax without it, the MLP's pre- and post-activation); they die in that
///   layer's backward;
/// - gradients appear during backward and die at the next step's `zero_grad`;
/// - AdamW allocates `exp_avg` and `exp_avg_sq` (2x params) at its first step; its foreach
///   update allocates a params-sized list of temporaries each step;
/// - every matmul may take a cuBLAS workspace of seeded random size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransformerTrain {
    pub layers: u64,
    pub hidden: u64,
    pub heads: u64,
    pub batch: u64,
    pub seq: u64,
    pub vocab: u64,
    pub steps: u64,
    /// Bytes per activation element (2: bf16 autocast).
    pub bytes: u64,
    /// Bytes per parameter, gradient and optimizer-state element (4: fp32).
    pub param_bytes: u64,
    /// 1: fused (flash) attention saves only its output and log-sum-exp; 0: the math path
    /// materialises `batch x heads x seq x seq` scores and keeps the softmax.
    pub flash: u64,
    pub seed: u64,
}

impl Default for TransformerTrain {
    fn default() -> Self {
        TransformerTrain {
            layers: 12,
            hidden: 768,
            heads: 12,
            batch: 8,
            seq: 512,
            vocab: 50304,
            steps: 3,
            bytes: 2,
            param_bytes: 4,
            flash: 1,
            seed: 0,
        }
    }
}

/// What one layer's forward leaves for its backward.
struct Saved {
    tensors: Vec<Tensor>,
}

impl TransformerTrain {
    pub const NAME: &'static str = "transformer-train";

    pub fn from_params(p: &mut Params) -> Result<Self, WorkloadError> {
        let d = TransformerTrain::default();
        Ok(TransformerTrain {
            layers: p.take_in("layers", d.layers, 1, 1024)?,
            hidden: p.take_in("hidden", d.hidden, 1, 65536)?,
            heads: p.take_in("heads", d.heads, 1, 1024)?,
            batch: p.take_in("batch", d.batch, 1, 65536)?,
            seq: p.take_in("seq", d.seq, 1, 1 << 20)?,
            vocab: p.take_in("vocab", d.vocab, 1, 1 << 24)?,
            steps: p.take_in("steps", d.steps, 1, 10_000)?,
            bytes: p.take_in("bytes", d.bytes, 1, 8)?,
            param_bytes: p.take_in("param_bytes", d.param_bytes, 1, 8)?,
            flash: p.take_in("flash", d.flash, 0, 1)?,
            seed: p.take("seed", d.seed),
        })
    }

    pub fn parameters(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("layers", self.layers),
            ("hidden", self.hidden),
            ("heads", self.heads),
            ("batch", self.batch),
            ("seq", self.seq),
            ("vocab", self.vocab),
            ("steps", self.steps),
            ("bytes", self.bytes),
            ("param_bytes", self.param_bytes),
            ("flash", self.flash),
            ("seed", self.seed),
        ]
    }

    /// Element counts of every parameter tensor, in module order.
    pub fn param_numels(&self) -> Vec<u64> {
        let h = self.hidden;
        let mut v = vec![self.vocab * h, self.seq * h];
        for _ in 0..self.layers {
            // ln1 (w, b), qkv (w, b), proj (w, b), ln2 (w, b), fc1 (w, b), fc2 (w, b)
            v.extend([h, h, h * 3 * h, 3 * h, h * h, h, h, h, h * 4 * h, 4 * h, 4 * h * h, h]);
        }
        v.extend([h, h]);
        v
    }

    /// Total parameter bytes.
    pub fn param_bytes_total(&self) -> u64 {
        self.param_numels().iter().sum::<u64>() * self.param_bytes
    }

    pub fn ops(&self) -> Vec<Op> {
        let mut p = Program::new(self.seed);
        let weights: Vec<Tensor> =
            self.param_numels().iter().map(|n| p.alloc(n * self.param_bytes)).collect();
        let mut grads: Vec<Tensor> = Vec::new();
        let mut adam: Vec<Tensor> = Vec::new();
        for _ in 0..self.steps {
            // optimizer.zero_grad(set_to_none=True)
            p.free_all(grads.drain(..));
            self.step(&mut p, &mut grads);
            self.adamw(&mut p, &mut adam);
        }
        p.free_all(grads);
        p.free_all(adam);
        p.free_all(weights);
        p.finish()
    }

    fn act(&self, elems_per_token: u64) -> u64 {
        self.batch * self.seq * elems_per_token * self.bytes
    }

    fn step(&self, p: &mut Program, grads: &mut Vec<Tensor>) {
        let tokens = self.batch * self.seq;
        let ids = p.alloc(tokens * 8);
        let targets = p.alloc(tokens * 8);
        let mut x = p.alloc(self.act(self.hidden));
        let mut saved = Vec::with_capacity(self.layers as usize);
        for _ in 0..self.layers {
            let (layer, out) = self.layer_forward(p, x);
            saved.push(layer);
            x = out;
        }
        // Final layer norm, logits (tied head) and cross-entropy in fp32.
        let lnf = p.alloc(self.act(self.hidden));
        let logits = p.alloc(self.act(self.vocab));
        p.workspace(4 * MIB);
        let log_probs = p.alloc(tokens * self.vocab * 4);
        let loss = p.alloc(4);

        // Backward.
        let grad_loss = p.alloc(4);
        let grad_logits = p.alloc(tokens * self.vocab * 4);
        p.free_all([log_probs, grad_loss, loss]);
        let grad_logits_lp = p.alloc(self.act(self.vocab));
        p.free(grad_logits);
        p.workspace(4 * MIB);
        let mut grad_x = p.alloc(self.act(self.hidden));
        p.free_all([grad_logits_lp, logits, lnf, x]);
        let numels = self.param_numels();
        grads.push(p.alloc(numels[0] * self.param_bytes)); // tied embedding / head
        let per_layer = 12;
        for (i, layer) in saved.into_iter().enumerate().rev() {
            grad_x = self.layer_backward(p, layer, grad_x);
            let first = 2 + i * per_layer;
            for n in &numels[first..first + per_layer] {
                grads.push(p.alloc(n * self.param_bytes));
            }
        }
        for n in &numels[numels.len() - 2..] {
            grads.push(p.alloc(n * self.param_bytes));
        }
        grads.push(p.alloc(numels[1] * self.param_bytes)); // position embedding
        p.free_all([grad_x, ids, targets]);
    }

    /// One decoder block's forward from residual `x`; returns what backward needs and the new
    /// residual.
    fn layer_forward(&self, p: &mut Program, x: Tensor) -> (Saved, Tensor) {
        let h = self.hidden;
        let stats = self.batch * self.seq * 4;
        let mut s = vec![x];
        s.push(p.alloc(self.act(h))); // ln1 out
        s.push(p.alloc(stats)); // ln1 mean
        s.push(p.alloc(stats)); // ln1 rstd
        p.workspace(4 * MIB);
        s.push(p.alloc(self.act(3 * h))); // qkv
        if self.flash == 1 {
            s.push(p.alloc(self.act(h))); // attention out
            s.push(p.alloc(self.batch * self.heads * self.seq * 4)); // logsumexp
        } else {
            let scores = self.batch * self.heads * self.seq * self.seq * self.bytes;
            let raw = p.alloc(scores);
            let softmax = p.alloc(scores);
            p.free(raw);
            s.push(softmax);
            s.push(p.alloc(self.act(h))); // attention out
        }
        p.workspace(4 * MIB);
        let proj = p.alloc(self.act(h));
        let mid = p.alloc(self.act(h)); // residual add
        p.free(proj);
        s.push(mid);
        s.push(p.alloc(self.act(h))); // ln2 out
        s.push(p.alloc(stats));
        s.push(p.alloc(stats));
        p.workspace(4 * MIB);
        s.push(p.alloc(self.act(4 * h))); // fc1 out
        s.push(p.alloc(self.act(4 * h))); // gelu out
        p.workspace(4 * MIB);
        let fc2 = p.alloc(self.act(h));
        let out = p.alloc(self.act(h)); // residual add
        p.free(fc2);
        (Saved { tensors: s }, out)
    }

    /// Backward of one block: a gradient per saved tensor, the saved tensors die, the incoming
    /// gradient is replaced by the gradient of the block input.
    fn layer_backward(&self, p: &mut Program, saved: Saved, grad_out: Tensor) -> Tensor {
        let mut grad = grad_out;
        for t in saved.tensors.into_iter().rev() {
            p.workspace(4 * MIB);
            let g = p.alloc(t.bytes);
            p.free(t);
            if g.bytes == grad.bytes {
                // Gradient of a residual-shaped tensor: becomes the gradient that flows on.
                p.free(grad);
                grad = g;
            } else {
                p.free(g);
            }
        }
        grad
    }

    /// `torch.optim.AdamW(foreach=True).step()`.
    fn adamw(&self, p: &mut Program, state: &mut Vec<Tensor>) {
        let numels = self.param_numels();
        if state.is_empty() {
            for n in &numels {
                state.push(p.alloc(n * self.param_bytes)); // exp_avg
                state.push(p.alloc(n * self.param_bytes)); // exp_avg_sq
            }
            state.push(p.alloc(numels.len() as u64 * 4)); // step counters
        }
        // _foreach_sqrt(exp_avg_sq) and the bias-corrected step: a list of temporaries.
        let temps: Vec<Tensor> = numels.iter().map(|n| p.alloc(n * self.param_bytes)).collect();
        p.free_all(temps);
    }
}
