//! Kernel uevents: the kernel announces every device added, removed, bound, unbound or changed
//! on its `NETLINK_KOBJECT_UEVENT` socket. A backend that subscribes to a subsystem
//! (`[requests] uevents = ["pci", "net", …]`, granted like any capability) is asked to
//! `discover` again as soon as one of its subsystem's events arrives, instead of at the next poll;
//! the periodic poll stays as a safety net (and for health facts no event announces, such as AER
//! counters).
//!
//! Uevents are sent to the host's network namespace: in a pod devplug needs `hostNetwork` to hear
//! them (the DaemonSet sets it). Where the socket cannot be opened, devplug says so once and
//! falls back to polling.

use std::os::fd::AsRawFd;
use std::time::Duration;

use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_KOBJECT_UEVENT};
use tokio::sync::mpsc;

/// The kernel's multicast group for uevents (udev re-broadcasts on group 2; devplug listens to
/// the kernel itself).
const KERNEL_GROUP: u32 = 1;
/// Events queued for the control loop; past this, events are dropped (every subscriber already
/// has a discover pending).
const QUEUE: usize = 1024;
/// How often the listening thread checks whether anyone still listens.
const WAKE: Duration = Duration::from_millis(500);

/// One uevent, as much of it as devplug uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Uevent {
    pub subsystem: String,
    pub action: String,
    pub devpath: String,
}

/// Listen to the kernel's uevents on a thread of their own. The thread ends soon after the
/// receiver is dropped.
pub fn listen() -> std::io::Result<mpsc::Receiver<Uevent>> {
    let mut socket = Socket::new(NETLINK_KOBJECT_UEVENT)?;
    socket.bind(&SocketAddr::new(0, KERNEL_GROUP))?;
    let timeout = nix::sys::time::TimeVal::new(WAKE.as_secs() as i64, WAKE.subsec_micros().into());
    // SAFETY: the descriptor belongs to `socket`, which is open and outlives this borrow.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(socket.as_raw_fd()) };
    nix::sys::socket::setsockopt(&fd, nix::sys::socket::sockopt::ReceiveTimeout, &timeout)?;
    let (tx, rx) = mpsc::channel(QUEUE);
    std::thread::Builder::new().name("devplug-uevents".into()).spawn(move || {
        while !tx.is_closed() {
            match socket.recv_from_full() {
                // Only the kernel (port 0) speaks on this group with authority.
                Ok((packet, from)) if from.port_number() == 0 => {
                    if let Ok(ev) = kobject_uevent::UEvent::from_netlink_packet(&packet) {
                        let _ = tx.try_send(Uevent {
                            subsystem: ev.subsystem,
                            action: format!("{:?}", ev.action).to_lowercase(),
                            devpath: ev.devpath.display().to_string(),
                        });
                    }
                }
                Ok(_) => {}
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(e) => {
                    tracing::warn!("kernel uevents stopped ({e}); devices change only at polls now");
                    return;
                }
            }
        }
    })?;
    Ok(rx)
}
