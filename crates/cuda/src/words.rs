//! Kernel parameters as words, for launches cudarc's builder cannot make: the builder has no
//! launch attributes, and programmatic dependent launch is one (`CudaBackend::launch_raw`).
//!
//! Each parameter takes one 64-bit word: a pointer or an i64 whole, an i32 or f32 in the low 4
//! bytes (the driver reads as many bytes as the kernel's parameter has). The device pointers'
//! guards (cudarc's stream-ordering events) live as long as the words, as the builder's do.

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};

pub(crate) struct Words<'a> {
    stream: &'a CudaStream,
    vals: Vec<u64>,
    guards: Vec<SyncOnDrop<'a>>,
}

impl<'a> Words<'a> {
    pub(crate) fn new(stream: &'a CudaStream) -> Self {
        Words {
            stream,
            vals: Vec::with_capacity(16),
            guards: Vec::with_capacity(8),
        }
    }

    /// A buffer the kernel reads.
    pub(crate) fn read<T>(&mut self, buf: &'a impl DevicePtr<T>) -> &mut Self {
        let (p, g) = buf.device_ptr(self.stream);
        self.vals.push(p);
        self.guards.push(g);
        self
    }

    /// A buffer the kernel writes (and may read).
    pub(crate) fn write<T>(&mut self, buf: &'a mut impl DevicePtrMut<T>) -> &mut Self {
        let (p, g) = buf.device_ptr_mut(self.stream);
        self.vals.push(p);
        self.guards.push(g);
        self
    }

    /// The word at `index` again (a pointer already given, for a parameter the kernel leaves
    /// unused at this launch).
    pub(crate) fn again(&mut self, index: usize) -> &mut Self {
        let v = self.vals.get(index).copied().unwrap_or(0);
        self.vals.push(v);
        self
    }

    /// A device address inside a buffer whose guard the caller holds until the launch (a piece
    /// of a buffer's rows).
    pub(crate) fn addr(&mut self, a: u64) -> &mut Self {
        self.vals.push(a);
        self
    }

    /// An absent optional buffer: a null pointer.
    pub(crate) fn null(&mut self) -> &mut Self {
        self.vals.push(0);
        self
    }

    pub(crate) fn i32(&mut self, v: i32) -> &mut Self {
        self.vals.push(u64::from(v as u32));
        self
    }

    pub(crate) fn i64(&mut self, v: i64) -> &mut Self {
        self.vals.push(v as u64);
        self
    }

    pub(crate) fn f32(&mut self, v: f32) -> &mut Self {
        self.vals.push(u64::from(v.to_bits()));
        self
    }

    /// The words, for `launch_raw`; the guards stay with `self`.
    pub(crate) fn vals(&mut self) -> &mut [u64] {
        &mut self.vals
    }
}
