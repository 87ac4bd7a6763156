//! PCI addresses a backend names (its devices' `pci` attribute), from which the host derives
//! Kubernetes' standard `pciBusID` and `pcieRoot`. A [`PciAddress`] exists only once the
//! address is well formed (`dddd:bb:dd.f`, lowercase hex, as `drivers/pci/probe.c` names
//! devices in sysfs), granted to the backend that named it, and present in sysfs: a backend can
//! no longer publish another vendor's NIC, or an address that does not exist, as its device's.

use super::Refused;

/// What the gate asks of the machine about one bus ID: the backend's sysfs grant, as its own
/// reads are judged, and whether the kernel lists the device.
pub trait PciLookup {
    /// Whether the backend may read `bus/pci/devices/<bus_id>/…` (and where it resolves).
    fn granted(&self, bus_id: &str) -> bool;
    /// Whether `bus/pci/devices/<bus_id>` exists.
    fn present(&self, bus_id: &str) -> bool;
}

/// A PCI bus ID that is well formed, granted to its backend and present in sysfs.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct PciAddress(String);

impl PciAddress {
    pub fn new(s: &str, machine: &dyn PciLookup) -> Result<PciAddress, Refused> {
        if !is_bus_id(s) {
            return Err(Refused::new("PCI address", s, "a bus ID as sysfs names it: dddd:bb:dd.f, lowercase hex"));
        }
        if !machine.granted(s) {
            return Err(Refused::new(
                "PCI address",
                s,
                "not granted to this backend (its sysfs grant does not cover bus/pci/devices/<address>)",
            ));
        }
        if !machine.present(s) {
            return Err(Refused::new("PCI address", s, "no such device in sysfs (bus/pci/devices/<address>)"));
        }
        Ok(PciAddress(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Whether `s` is a PCI bus ID as sysfs names devices: `dddd:bb:dd.f`, lowercase hex.
pub fn is_bus_id(s: &str) -> bool {
    let b = s.as_bytes();
    let hex = |r: std::ops::Range<usize>| b[r].iter().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c));
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && hex(0..4)
        && hex(5..7)
        && hex(8..10)
        && (b'0'..=b'7').contains(&b[11])
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    struct Machine {
        granted: &'static [&'static str],
        present: &'static [&'static str],
    }
    impl PciLookup for Machine {
        fn granted(&self, id: &str) -> bool {
            self.granted.contains(&id)
        }
        fn present(&self, id: &str) -> bool {
            self.present.contains(&id)
        }
    }
    const M: Machine =
        Machine { granted: &["0000:3b:00.0", "0000:99:00.0"], present: &["0000:3b:00.0", "0000:5e:00.0"] };

    #[test]
    fn an_address_must_be_granted_and_present() {
        assert_eq!(PciAddress::new("0000:3b:00.0", &M).unwrap().as_str(), "0000:3b:00.0");
        let not_granted = PciAddress::new("0000:5e:00.0", &M).unwrap_err().to_string();
        assert!(not_granted.contains("not granted"), "{not_granted}");
        let absent = PciAddress::new("0000:99:00.0", &M).unwrap_err().to_string();
        assert!(absent.contains("no such device"), "{absent}");
        for bad in ["0000:3B:00.0", "0000:3b:00.8", "0000:3b:00", "../../../etc", "0000:3b:00.0/..", ""] {
            assert!(PciAddress::new(bad, &M).is_err(), "{bad}");
        }
    }

    proptest! {
        #[test]
        fn no_input_yields_an_address_that_is_malformed_ungranted_or_absent(s in "[0-9a-fA-F:./]{0,14}|.{0,14}") {
            let everything = Machine { granted: &[], present: &[] };
            prop_assert!(PciAddress::new(&s, &everything).is_err());
            if let Ok(a) = PciAddress::new(&s, &M) {
                prop_assert!(is_bus_id(a.as_str()));
                prop_assert!(M.granted(a.as_str()) && M.present(a.as_str()));
            }
        }
    }
}
