//! Kernel uevents: the kernel announces every device added, removed, bound, unbound or changed
//! on its `NETLINK_KOBJECT_UEVENT` socket. A backend that subscribes to a subsystem
//! (`[requests] uevents = ["pci", "net", …]`, granted like any capability) is asked to
//! `discover` again as soon as one of its subsystem's events arrives, instead of at the next poll;
//! the periodic poll stays as a safety net (and for health facts no event announces, such as AER
//! counters).
//!
//! Link state is not a uevent: a NIC losing its carrier, or an interface going up or down, is
//! announced only on rtnetlink (`RTMGRP_LINK`). Those announcements arrive here as events of the
//! `net` subsystem (action `link`), so a backend subscribed to `net` sees a link drop at once.
//!
//! Both are sent to the host's network namespace: in a pod devplug needs `hostNetwork` to hear
//! them (the DaemonSet sets it). Where a socket cannot be opened, devplug says so once and
//! falls back to polling.

use std::os::fd::AsRawFd;
use std::time::Duration;

use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_KOBJECT_UEVENT, protocols::NETLINK_ROUTE};
use tokio::sync::mpsc;

/// The kernel's multicast group for uevents (udev re-broadcasts on group 2; devplug listens to
/// the kernel itself).
const KERNEL_GROUP: u32 = 1;
/// rtnetlink's multicast group for link changes (`RTMGRP_LINK`): only `RTM_NEWLINK` and
/// `RTM_DELLINK` messages are sent on it.
const RTMGRP_LINK: u32 = 1;
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

/// Listen to the kernel's uevents, and to rtnetlink's link changes, on threads of their own.
/// The threads end soon after the receiver is dropped. Without rtnetlink (the socket cannot be
/// opened) uevents still work, and a warning says link changes wait for polls.
pub fn listen() -> std::io::Result<mpsc::Receiver<Uevent>> {
    let (tx, rx) = mpsc::channel(QUEUE);
    let uevents = bound(NETLINK_KOBJECT_UEVENT, KERNEL_GROUP)?;
    spawn("devplug-uevents", uevents, tx.clone(), |packet| {
        kobject_uevent::UEvent::from_netlink_packet(packet).ok().map(|ev| Uevent {
            subsystem: ev.subsystem,
            action: format!("{:?}", ev.action).to_lowercase(),
            devpath: ev.devpath.display().to_string(),
        })
    })?;
    match bound(NETLINK_ROUTE, RTMGRP_LINK) {
        // Every message on this group is a link added, changed or removed; which one does not
        // matter: the subscribed backends discover and see for themselves.
        Ok(links) => spawn("devplug-links", links, tx, |_| {
            Some(Uevent { subsystem: "net".into(), action: "link".into(), devpath: String::new() })
        })?,
        Err(e) => tracing::warn!("cannot listen to link changes ({e}); a carrier lost is seen at the next poll"),
    }
    Ok(rx)
}

/// A netlink socket of `protocol` joined to multicast `group`, its reads bounded so its thread
/// notices when nobody listens any more.
fn bound(protocol: isize, group: u32) -> std::io::Result<Socket> {
    let mut socket = Socket::new(protocol)?;
    socket.bind(&SocketAddr::new(0, group))?;
    let timeout = nix::sys::time::TimeVal::new(WAKE.as_secs() as i64, WAKE.subsec_micros().into());
    // SAFETY: the descriptor belongs to `socket`, which is open and outlives this borrow.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(socket.as_raw_fd()) };
    nix::sys::socket::setsockopt(&fd, nix::sys::socket::sockopt::ReceiveTimeout, &timeout)?;
    Ok(socket)
}

/// Read `socket` on thread `name`, turning each packet from the kernel into an event with `parse`.
fn spawn(
    name: &str,
    socket: Socket,
    tx: mpsc::Sender<Uevent>,
    parse: fn(&[u8]) -> Option<Uevent>,
) -> std::io::Result<()> {
    std::thread::Builder::new().name(name.into()).spawn(move || {
        while !tx.is_closed() {
            match socket.recv_from_full() {
                // Only the kernel (port 0) speaks on these groups with authority.
                Ok((packet, from)) if from.port_number() == 0 => {
                    if let Some(ev) = parse(&packet) {
                        let _ = tx.try_send(ev);
                    }
                }
                Ok(_) => {}
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(e) => {
                    tracing::warn!("kernel events stopped ({e}); devices change only at polls now");
                    return;
                }
            }
        }
    })?;
    Ok(())
}
