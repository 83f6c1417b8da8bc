//! A ResNet-style CNN trained with SGD and momentum.

use crate::program::{Program, Tensor};
use crate::{Params, WorkloadError};
use allocsim_core::{Op, MIB};

/// `cnn-train`: `steps` training steps of a ResNet with `stages` stages of `blocks` basic
/// blocks, `width` channels in the first stage doubling per stage, on `batch` images of
/// `image x image` pixels.
///
/// Every convolution may take a cuDNN workspace of seeded random size (up to 64 MiB). Forward
/// saves each convolution's and batch norm's output (ReLU runs in place) plus the batch-norm
/// statistics; backward frees them block by block in reverse and allocates the weight
/// gradients, which live until the next `zero_grad`. SGD allocates one momentum buffer per
/// parameter at its first step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CnnTrain {
    pub batch: u64,
    pub image: u64,
    pub width: u64,
    pub stages: u64,
    pub blocks: u64,
    pub classes: u64,
    pub steps: u64,
    /// Bytes per element (4: fp32).
    pub bytes: u64,
    pub seed: u64,
}

impl Default for CnnTrain {
    fn default() -> Self {
        CnnTrain {
            batch: 32,
            image: 224,
            width: 64,
            stages: 4,
            blocks: 2,
            classes: 1000,
            steps: 3,
            bytes: 4,
            seed: 0,
        }
    }
}

/// A convolution followed by batch norm, with its parameters.
#[derive(Debug, Clone, Copy)]
struct ConvBn {
    c_in: u64,
    c_out: u64,
    kernel: u64,
    stride: u64,
}

impl ConvBn {
    /// Conv weight, BN weight and bias (running stats are buffers, not parameters).
    fn param_numels(&self) -> [u64; 3] {
        [self.c_in * self.c_out * self.kernel * self.kernel, self.c_out, self.c_out]
    }
}

impl CnnTrain {
    pub const NAME: &'static str = "cnn-train";

    pub fn from_params(p: &mut Params) -> Result<Self, WorkloadError> {
        let d = CnnTrain::default();
        Ok(CnnTrain {
            batch: p.take_in("batch", d.batch, 1, 65536)?,
            image: p.take_in("image", d.image, 8, 16384)?,
            width: p.take_in("width", d.width, 1, 8192)?,
            stages: p.take_in("stages", d.stages, 1, 8)?,
            blocks: p.take_in("blocks", d.blocks, 1, 64)?,
            classes: p.take_in("classes", d.classes, 1, 1 << 20)?,
            steps: p.take_in("steps", d.steps, 1, 10_000)?,
            bytes: p.take_in("bytes", d.bytes, 1, 8)?,
            seed: p.take("seed", d.seed),
        })
    }

    pub fn parameters(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("batch", self.batch),
            ("image", self.image),
            ("width", self.width),
            ("stages", self.stages),
            ("blocks", self.blocks),
            ("classes", self.classes),
            ("steps", self.steps),
            ("bytes", self.bytes),
            ("seed", self.seed),
        ]
    }

    /// The network's conv-bn layers in order: the stem, then per block conv1, conv2 and, where
    /// the shape changes, the 1x1 downsample.
    fn layers(&self) -> Vec<ConvBn> {
        let mut v = vec![ConvBn { c_in: 3, c_out: self.width, kernel: 7, stride: 2 }];
        let mut c = self.width;
        for stage in 0..self.stages {
            let c_out = self.width << stage;
            for block in 0..self.blocks {
                let stride = if stage > 0 && block == 0 { 2 } else { 1 };
                v.push(ConvBn { c_in: c, c_out, kernel: 3, stride });
                v.push(ConvBn { c_in: c_out, c_out, kernel: 3, stride: 1 });
                if stride != 1 || c != c_out {
                    v.push(ConvBn { c_in: c, c_out, kernel: 1, stride });
                }
                c = c_out;
            }
        }
        v
    }

    fn param_numels(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.layers().iter().flat_map(|l| l.param_numels()).collect();
        let c_last = self.width << (self.stages - 1);
        v.extend([c_last * self.classes, self.classes]);
        v
    }

    pub fn param_bytes_total(&self) -> u64 {
        self.param_numels().iter().sum::<u64>() * self.bytes
    }

    pub fn ops(&self) -> Vec<Op> {
        let mut p = Program::new(self.seed);
        let weights: Vec<Tensor> =
            self.param_numels().iter().map(|n| p.alloc(n * self.bytes)).collect();
        // BN running mean and var: buffers that live as long as the weights.
        let buffers: Vec<Tensor> = self
            .layers()
            .iter()
            .flat_map(|l| [l.c_out, l.c_out])
            .map(|c| p.alloc(c * self.bytes))
            .collect();
        let mut grads: Vec<Tensor> = Vec::new();
        let mut momentum: Vec<Tensor> = Vec::new();
        for _ in 0..self.steps {
            p.free_all(grads.drain(..));
            self.step(&mut p, &mut grads);
            if momentum.is_empty() {
                momentum = self.param_numels().iter().map(|n| p.alloc(n * self.bytes)).collect();
            }
        }
        p.free_all(grads);
        p.free_all(momentum);
        p.free_all(buffers);
        p.free_all(weights);
        p.finish()
    }

    fn step(&self, p: &mut Program, grads: &mut Vec<Tensor>) {
        let input = p.alloc(self.batch * 3 * self.image * self.image * self.bytes);
        let labels = p.alloc(self.batch * 8);
        let mut side = self.image;
        let mut saved: Vec<Vec<Tensor>> = Vec::new();
        for (i, layer) in self.layers().iter().enumerate() {
            side = side.div_ceil(layer.stride);
            let act = self.batch * layer.c_out * side * side * self.bytes;
            p.workspace(64 * MIB);
            let conv = p.alloc(act);
            let bn = p.alloc(act);
            let stats = [p.alloc(layer.c_out * 4), p.alloc(layer.c_out * 4)];
            let mut keep = vec![conv, bn, stats[0], stats[1]];
            if i == 0 {
                // Max pool after the stem: output and indices.
                side = side.div_ceil(2);
                let pooled = self.batch * layer.c_out * side * side;
                keep.push(p.alloc(pooled * self.bytes));
                keep.push(p.alloc(pooled * 8));
            }
            saved.push(keep);
        }
        let c_last = self.width << (self.stages - 1);
        let pooled = p.alloc(self.batch * c_last * self.bytes);
        let logits = p.alloc(self.batch * self.classes * self.bytes);
        let loss = p.alloc(4);

        let grad_logits = p.alloc(self.batch * self.classes * self.bytes);
        p.free_all([loss, logits]);
        grads.push(p.alloc(c_last * self.classes * self.bytes));
        grads.push(p.alloc(self.classes * self.bytes));
        let grad_pooled = p.alloc(self.batch * c_last * self.bytes);
        p.free_all([grad_logits, pooled]);
        let mut grad = grad_pooled;
        for (layer, keep) in self.layers().iter().zip(saved).rev() {
            for t in keep.into_iter().rev() {
                if t.bytes == layer.c_out * 4 {
                    // Batch-norm statistics: read by the backward kernel, no gradient flows.
                    p.free(t);
                    continue;
                }
                let g = p.alloc(t.bytes);
                p.free(t);
                p.free(grad);
                grad = g;
            }
            p.workspace(64 * MIB);
            for n in layer.param_numels() {
                grads.push(p.alloc(n * self.bytes));
            }
        }
        p.free_all([grad, input, labels]);
    }
}
