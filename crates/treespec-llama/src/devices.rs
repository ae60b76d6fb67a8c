//! Where the models run: the compute devices llama.cpp's backends offer (the CPU always; a GPU
//! when the binary was built with a GPU backend — `cargo build --features cuda|vulkan|metal|rocm`,
//! docs/GPU.md) and how many layers of a model go to one.
//!
//! treespec drives llama.cpp's own backends, not a runtime of its own: the same GGUF files, the
//! same `llama_decode`, with `n_gpu_layers` and the device list set on the model's parameters as
//! llama.cpp's tools do (`-ngl`, `-ngld`, `-dev`, `--list-devices`).

use std::ffi::{CStr, CString};

use treespec_engine::{EngineError, Result};

use crate::backend;

/// What kind of device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    /// The host's CPU.
    Cpu,
    /// A discrete GPU.
    Gpu,
    /// A GPU sharing the host's memory.
    IntegratedGpu,
    /// Another accelerator (BLAS, AMX, …), used beside the CPU, not offloaded to.
    Accelerator,
}

/// One device of this build and machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// llama.cpp's name (`CPU`, `CUDA0`, `Vulkan0`, `Metal`, …): what `--device` takes.
    pub name: String,
    /// What the driver calls it.
    pub description: String,
    /// What kind.
    pub kind: DeviceKind,
    /// Memory in bytes: free and total.
    pub memory: (usize, usize),
}

impl Device {
    /// Whether layers can be offloaded to it.
    pub fn takes_layers(&self) -> bool {
        matches!(self.kind, DeviceKind::Gpu | DeviceKind::IntegratedGpu)
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (free, total) = self.memory;
        let mib = |b: usize| b / (1 << 20);
        write!(f, "{}: {} ({} of {} MiB free)", self.name, self.description, mib(free), mib(total))
    }
}

/// Every device the backends of this build found on this machine, the CPU included.
pub fn devices() -> Result<Vec<Device>> {
    backend::backend()?;
    // SAFETY: the backend registry is initialised (above); indices below the count are valid and
    // the returned strings live as long as the registry (the process).
    unsafe {
        let n = llama_cpp_sys_2::ggml_backend_dev_count();
        Ok((0..n).map(|i| describe(llama_cpp_sys_2::ggml_backend_dev_get(i))).collect())
    }
}

/// # Safety
/// `dev` is a device of the initialised registry.
unsafe fn describe(dev: llama_cpp_sys_2::ggml_backend_dev_t) -> Device {
    let text = |p: *const std::os::raw::c_char| {
        if p.is_null() {
            String::new()
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    };
    let (mut free, mut total) = (0usize, 0usize);
    llama_cpp_sys_2::ggml_backend_dev_memory(dev, &mut free, &mut total);
    let kind = match llama_cpp_sys_2::ggml_backend_dev_type(dev) {
        llama_cpp_sys_2::GGML_BACKEND_DEVICE_TYPE_CPU => DeviceKind::Cpu,
        llama_cpp_sys_2::GGML_BACKEND_DEVICE_TYPE_GPU => DeviceKind::Gpu,
        llama_cpp_sys_2::GGML_BACKEND_DEVICE_TYPE_IGPU => DeviceKind::IntegratedGpu,
        _ => DeviceKind::Accelerator,
    };
    Device {
        name: text(llama_cpp_sys_2::ggml_backend_dev_name(dev)),
        description: text(llama_cpp_sys_2::ggml_backend_dev_description(dev)),
        kind,
        memory: (free, total),
    }
}

/// How many of a model's layers go to a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GpuLayers {
    /// None: the model runs on the CPU (the default, whatever the build).
    #[default]
    None,
    /// `n` layers: llama.cpp offloads the last `n` repeating layers, and the output layer too
    /// once `n` exceeds them.
    Count(u32),
    /// Every layer and the output layer.
    All,
}

impl GpuLayers {
    /// llama.cpp's spelling: a count, or `all` / `auto` / `-1` for every layer.
    pub fn parse(s: &str) -> std::result::Result<Self, String> {
        match s.trim() {
            "all" | "auto" | "-1" => Ok(Self::All),
            n => match n.parse::<u32>() {
                Ok(0) => Ok(Self::None),
                Ok(n) => Ok(Self::Count(n)),
                Err(_) => Err(format!("expected a number of layers, `all` or `auto`, got {n:?}")),
            },
        }
    }

    /// Whether any layer is offloaded.
    pub fn any(self) -> bool {
        self != Self::None
    }

    /// `n_gpu_layers` of llama.cpp's model parameters (beyond the layer count means all of them).
    pub(crate) fn param(self) -> i32 {
        match self {
            Self::None => 0,
            Self::Count(n) => n.min(i32::MAX as u32) as i32,
            Self::All => i32::MAX,
        }
    }
}

/// Where one model runs: its layers on a GPU, and which device (None: llama.cpp's choice, the
/// first GPU).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Offload {
    /// Layers offloaded.
    pub layers: GpuLayers,
    /// The device by name (see [`devices`]).
    pub device: Option<String>,
}

/// The device list to put on a model's parameters (NULL-terminated, as llama.cpp wants it;
/// keep it alive until the model is loaded), checked against this build's devices.
pub(crate) struct DeviceList(Vec<llama_cpp_sys_2::ggml_backend_dev_t>);

impl DeviceList {
    /// For `offload`: None when no layer is offloaded or llama.cpp may pick its GPU; an error
    /// naming the problem when a GPU is asked for and this build or machine has none, or the
    /// named device does not exist or takes no layers.
    pub(crate) fn for_offload(offload: &Offload) -> Result<Option<Self>> {
        Self::for_offload_of(offload, "--n-gpu-layers (-ngl)")
    }

    /// [`Self::for_offload`], its errors naming `flag` (the draft's is `-ngld`).
    pub(crate) fn for_offload_of(offload: &Offload, flag: &str) -> Result<Option<Self>> {
        let bad = |m: String| Err(EngineError::InvalidRequest(m));
        if !offload.layers.any() {
            if let Some(d) = &offload.device {
                if !d.eq_ignore_ascii_case("none") && !d.eq_ignore_ascii_case("cpu") {
                    return bad(format!("--device {d} offloads nothing without {flag}"));
                }
            }
            return Ok(None);
        }
        let all = devices()?;
        let gpus: Vec<&Device> = all.iter().filter(|d| d.takes_layers()).collect();
        if gpus.is_empty() {
            return bad(format!(
                "{flag} asks for a GPU, but this build has no GPU backend or this machine no GPU \
                 (devices: {}); build with `--features cuda`, `vulkan`, `metal` or `rocm` (docs/GPU.md)",
                all.iter().map(|d| d.name.as_str()).collect::<Vec<_>>().join(", ")
            ));
        }
        let Some(name) = &offload.device else { return Ok(None) };
        let Some(found) = gpus.iter().find(|d| d.name.eq_ignore_ascii_case(name)) else {
            return bad(format!(
                "no GPU device named {name:?} (this machine's: {})",
                gpus.iter().map(|d| d.name.as_str()).collect::<Vec<_>>().join(", ")
            ));
        };
        let cname =
            CString::new(found.name.clone()).map_err(|e| EngineError::InvalidRequest(e.to_string()))?;
        // SAFETY: the registry is initialised (devices() above) and the name is one of its devices.
        let dev = unsafe { llama_cpp_sys_2::ggml_backend_dev_by_name(cname.as_ptr()) };
        if dev.is_null() {
            return bad(format!("the device {name} vanished"));
        }
        Ok(Some(Self(vec![dev, std::ptr::null_mut()])))
    }

    /// The pointer for `llama_model_params::devices`.
    pub(crate) fn as_param(&mut self) -> *mut llama_cpp_sys_2::ggml_backend_dev_t {
        self.0.as_mut_ptr()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_counts_read_as_llama_cpp_writes_them() {
        assert_eq!(GpuLayers::parse("0"), Ok(GpuLayers::None));
        assert_eq!(GpuLayers::parse("33"), Ok(GpuLayers::Count(33)));
        for all in ["all", "auto", "-1"] {
            assert_eq!(GpuLayers::parse(all), Ok(GpuLayers::All));
        }
        assert!(GpuLayers::parse("many").is_err());
        assert_eq!(GpuLayers::All.param(), i32::MAX);
        assert_eq!(GpuLayers::None.param(), 0);
    }
}
