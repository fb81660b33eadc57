//! Where a pool's memory lives, named as DLPack names devices: a device type code
//! (`DLDeviceType`) and an index. npumem never touches device memory; the device is what a
//! pool reports to consumers of its blocks (DLPack, the C ABI).

/// A device: a DLPack device type code and the device's index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Device {
    /// The DLPack `DLDeviceType` code (`kDLCPU` = 1, `kDLCUDA` = 2, ...).
    pub type_code: i32,
    /// The device index (0 for the CPU).
    pub index: i32,
}

/// The device types by name, with their DLPack codes.
pub const DEVICE_TYPES: [(&str, i32); 15] = [
    ("cpu", 1),
    ("cuda", 2),
    ("cuda_host", 3),
    ("opencl", 4),
    ("vulkan", 7),
    ("metal", 8),
    ("vpi", 9),
    ("rocm", 10),
    ("rocm_host", 11),
    ("ext_dev", 12),
    ("cuda_managed", 13),
    ("oneapi", 14),
    ("webgpu", 15),
    ("hexagon", 16),
    ("maia", 17),
];

impl Device {
    /// Host memory.
    pub const CPU: Device = Device { type_code: 1, index: 0 };
    /// Memory that no array library reads directly: the device of pools without host memory
    /// that do not name theirs.
    pub const EXT_DEV: Device = Device { type_code: 12, index: 0 };

    /// The device of a type name (`"cuda"`, ...) and an index; `None` for an unknown name. The
    /// index is taken as it is: a pool's configuration refuses a negative one
    /// ([`PoolConfig::validate`](crate::PoolConfig::validate)).
    pub fn from_name(name: &str, index: i32) -> Option<Device> {
        DEVICE_TYPES.iter().find(|(n, _)| *n == name).map(|&(_, type_code)| Device { type_code, index })
    }

    /// The name of the device's type, or `None` for a code without one.
    pub fn type_name(self) -> Option<&'static str> {
        DEVICE_TYPES.iter().find(|(_, code)| *code == self.type_code).map(|&(name, _)| name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_codes_round_trip() {
        for (name, code) in DEVICE_TYPES {
            let device = Device::from_name(name, 3).unwrap();
            assert_eq!((device.type_code, device.index), (code, 3));
            assert_eq!(device.type_name(), Some(name));
        }
        assert_eq!(Device::from_name("tpu", 0), None);
        assert_eq!(Device { type_code: 99, index: 0 }.type_name(), None);
    }
}
