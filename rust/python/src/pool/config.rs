//! `Pool(...)`'s keyword arguments, checked and turned into a `PoolConfig`.

use npumem_core::{Backing, Device, Placement, PoolConfig, DEVICE_TYPES};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFrozenSet, PySet, PyString};

use crate::args;
use crate::errors::{error, ErrorClass};

/// A `ConfigError` with the standard prefix.
pub(super) fn config_error(message: String) -> PyErr {
    error(ErrorClass::Config, format!("invalid pool configuration: {message}"))
}

/// The configuration the arguments describe (unset ones take the core's defaults; `cores`
/// defaults to the CPU count).
#[allow(clippy::too_many_arguments)]
pub(super) fn pool_config(
    py: Python<'_>,
    capacity: &Bound<'_, PyAny>,
    cores: Option<&Bound<'_, PyAny>>,
    chunk_size: Option<&Bound<'_, PyAny>>,
    min_block: Option<&Bound<'_, PyAny>>,
    bank_size: Option<&Bound<'_, PyAny>>,
    alignment: Option<&Bound<'_, PyAny>>,
    slab_sizes: Option<&Bound<'_, PyAny>>,
    backing: Option<&Bound<'_, PyAny>>,
    placement: Option<&Bound<'_, PyAny>>,
    run_tails: Option<&Bound<'_, PyAny>>,
    core_reserve: Option<&Bound<'_, PyAny>>,
    base_address: Option<&Bound<'_, PyAny>>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<PoolConfig> {
    let cores = match cores.filter(|c| !c.is_none()) {
        Some(c) => args::config_int(c, "cores")?,
        None => py.import("os")?.call_method0("cpu_count")?.extract::<Option<usize>>()?.unwrap_or(1),
    };
    let defaults = PoolConfig::new(0);
    let field = |value: Option<&Bound<'_, PyAny>>, name: &str, default: usize| match value.filter(|v| !v.is_none()) {
        Some(v) => args::config_int(v, name),
        None => Ok(default),
    };
    let mut config = PoolConfig::new(args::config_int(capacity, "capacity")?)
        .cores(cores)
        .chunk_size(field(chunk_size, "chunk_size", defaults.chunk_size)?)
        .min_block(field(min_block, "min_block", defaults.min_block)?)
        .bank_size(field(bank_size, "bank_size", defaults.bank_size)?)
        .alignment(field(alignment, "alignment", defaults.alignment)?)
        .core_reserve(field(core_reserve, "core_reserve", defaults.core_reserve)?);
    if let Some(sizes) = slab_sizes.filter(|s| !s.is_none()) {
        // A str, a mapping or a set is not an ordered list of sizes (a dict would give its keys).
        if sizes.is_instance_of::<PyString>()
            || sizes.is_instance_of::<PyDict>()
            || sizes.is_instance_of::<PySet>()
            || sizes.is_instance_of::<PyFrozenSet>()
        {
            return Err(config_error(format!("slab_sizes must be a sequence of ints, got {}", args::type_name(sizes))));
        }
        let items = sizes.try_iter().map_err(|_| {
            config_error(format!("slab_sizes must be a sequence of ints, got {}", args::type_name(sizes)))
        })?;
        let mut list = Vec::new();
        for (i, item) in items.enumerate() {
            list.push(args::config_int(&item?, &format!("slab_sizes[{i}]"))?);
        }
        config = config.slab_sizes(list);
    }
    let choice = |value: Option<&Bound<'_, PyAny>>, default: &str| -> PyResult<String> {
        match value.filter(|v| !v.is_none()) {
            Some(v) => Ok(v.extract::<String>().unwrap_or_else(|_| format!("<{}>", args::type_name(v)))),
            None => Ok(default.to_string()),
        }
    };
    config = config.backing(match choice(backing, "host")?.as_str() {
        "host" => Backing::Host,
        "none" => Backing::None,
        other => return Err(config_error(format!("backing must be \"host\" or \"none\", got {other:?}"))),
    });
    config = config.placement(match choice(placement, "best-fit")?.as_str() {
        "best-fit" => Placement::BestFit,
        "first-fit" => Placement::FirstFit,
        other => return Err(config_error(format!("placement must be \"best-fit\" or \"first-fit\", got {other:?}"))),
    });
    if let Some(on) = run_tails.filter(|v| !v.is_none()) {
        let on = on
            .cast::<PyBool>()
            .map_err(|_| config_error(format!("run_tails must be a bool, got {}", args::type_name(on))))?;
        config = config.run_tails(on.is_true());
    }
    if let Some(base) = base_address.filter(|b| !b.is_none()) {
        let base = args::integer(base, "base_address", ErrorClass::Config)?;
        let base = u64::try_from(base)
            .map_err(|_| config_error(format!("base_address must be between 0 and 2^64 - 1, got {base}")))?;
        config = config.base_address(base);
    }
    if let Some(device) = device.filter(|d| !d.is_none()) {
        config = config.device(parse_device(device)?);
    }
    Ok(config)
}

/// `config` with `max_capacity` and `grow_by` (both unset: a pool that cannot grow).
pub(super) fn growth_config(
    config: PoolConfig,
    max_capacity: Option<&Bound<'_, PyAny>>,
    grow_by: Option<&Bound<'_, PyAny>>,
) -> PyResult<PoolConfig> {
    let int = |value: Option<&Bound<'_, PyAny>>, name: &str| -> PyResult<Option<usize>> {
        value.filter(|v| !v.is_none()).map(|v| args::config_int(v, name)).transpose()
    };
    Ok(PoolConfig { max_capacity: int(max_capacity, "max_capacity")?, grow_by: int(grow_by, "grow_by")?, ..config })
}

/// `device=("cuda", 0)`: a DLPack device type name (or code) and an index.
fn parse_device(value: &Bound<'_, PyAny>) -> PyResult<Device> {
    let names = || DEVICE_TYPES.iter().map(|(name, _)| format!("{name:?}")).collect::<Vec<_>>().join(", ");
    let pair: Option<(Bound<'_, PyAny>, Bound<'_, PyAny>)> =
        if value.is_instance_of::<PyString>() { None } else { value.extract().ok() };
    let Some((kind, index)) = pair else {
        return Err(config_error(format!(
            "device must be a (type, index) pair such as (\"cuda\", 0), got {}",
            value.repr().map_or_else(|_| args::type_name(value), |r| r.to_string())
        )));
    };
    let index = args::integer(&index, "device index", ErrorClass::Config)?;
    let index = i32::try_from(index).map_err(|_| config_error(format!("device index is out of range, got {index}")))?;
    if let Ok(name) = kind.extract::<String>() {
        return Device::from_name(&name, index)
            .ok_or_else(|| config_error(format!("device type must be one of {}, got {name:?}", names())));
    }
    let code = args::integer(&kind, "device type", ErrorClass::Config)?;
    let type_code =
        i32::try_from(code).map_err(|_| config_error(format!("device type code is out of range, got {code}")))?;
    Ok(Device { type_code, index })
}
