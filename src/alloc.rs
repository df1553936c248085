//! The binary's global allocator: mimalloc, asked for plain blocks where they are aligned enough.
//!
//! mimalloc's own Rust adapter asks `mi_malloc_aligned` for every layout. mimalloc 3 serves that
//! as a plain allocation only for blocks of at most 1 KiB or of a power-of-two size up to
//! 4 KiB; any other block (a 1.5 KiB body, a 12 KiB buffer) goes through its over-allocating
//! path, which allocates `size + align - 1` bytes and marks the page as holding interior
//! pointers, even for an alignment of 1. Every mimalloc block is aligned to 8 bytes, and to 16
//! when it is larger than 8 bytes: so a layout whose alignment is at most 16 and at most its
//! size (the rule of std's own `System` allocator) takes plain `mi_malloc`, and only the others
//! the aligned calls. Measured with `benches/load/instructions.sh` (docs/PERFORMANCE.md, "The
//! allocator"): 65,802 instructions per whole answer against 66,557 with every block from the
//! aligned calls, 483,065 per 200-event stream against 484,589.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys as mi;

/// The alignment every mimalloc block of more than 8 bytes has (`MI_MAX_ALIGN_SIZE`).
const PLAIN_ALIGN: usize = 16;

/// mimalloc as the global allocator; see the module's text.
pub struct MiMalloc;

/// Whether a block of `size` bytes from the plain calls is aligned to `align`.
#[inline]
fn plain(align: usize, size: usize) -> bool {
    align <= PLAIN_ALIGN && align <= size
}

/// A new block for `layout`: from `plain_call` when such a block is aligned enough, else from
/// `aligned_call` (`mi_malloc` and `mi_malloc_aligned`, or their zeroing twins).
///
/// # Safety
///
/// `layout` has a non-zero size, as `GlobalAlloc::alloc` requires.
#[inline(always)]
unsafe fn new_block(
    layout: Layout,
    plain_call: unsafe extern "C" fn(usize) -> *mut c_void,
    aligned_call: unsafe extern "C" fn(usize, usize) -> *mut c_void,
) -> *mut u8 {
    let (size, align) = (layout.size(), layout.align());
    // SAFETY: both calls take any size and a power-of-two alignment (a `Layout`'s).
    let block = unsafe {
        if plain(align, size) {
            plain_call(size)
        } else {
            aligned_call(size, align)
        }
    };
    block.cast()
}

// SAFETY: every call hands mimalloc the layout's size, and its alignment unless a plain block
// of that size is already aligned to it (see `plain`); every pointer freed or resized came from
// mimalloc, as `GlobalAlloc`'s contract guarantees.
unsafe impl GlobalAlloc for MiMalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: see the impl.
        unsafe { new_block(layout, mi::mi_malloc, mi::mi_malloc_aligned) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: see the impl.
        unsafe { new_block(layout, mi::mi_zalloc, mi::mi_zalloc_aligned) }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: see the impl.
        unsafe { mi::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let align = layout.align();
        // SAFETY: see the impl.
        unsafe {
            if plain(align, new_size) {
                mi::mi_realloc(ptr.cast::<c_void>(), new_size).cast()
            } else {
                mi::mi_realloc_aligned(ptr.cast::<c_void>(), new_size, align).cast()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sizes around mimalloc's size classes, its 1 KiB small-block limit and its 4 KiB
    /// natural-alignment limit, with every alignment from 1 to 8 KiB.
    fn layouts() -> impl Iterator<Item = Layout> {
        let sizes = [
            1, 2, 3, 7, 8, 9, 12, 15, 16, 17, 24, 31, 40, 48, 63, 100, 1000, 1024, 1025, 1500,
            4095, 4096, 4097, 8000, 65_537,
        ];
        sizes.into_iter().flat_map(|size| {
            (0..14).filter_map(move |shift| Layout::from_size_align(size, 1 << shift).ok())
        })
    }

    fn assert_aligned(ptr: *mut u8, layout: Layout) {
        assert!(!ptr.is_null(), "{layout:?}: no block");
        assert_eq!(ptr as usize % layout.align(), 0, "{layout:?}: misaligned");
    }

    #[test]
    fn every_block_has_its_layouts_alignment_and_size() {
        let a = MiMalloc;
        for layout in layouts() {
            // Several blocks of one layout, so some come from the middle of a page.
            let blocks: Vec<*mut u8> = (0..5)
                .map(|_| {
                    // SAFETY: the layout's size is not zero.
                    let ptr = unsafe { a.alloc(layout) };
                    assert_aligned(ptr, layout);
                    // SAFETY: the block holds `layout.size()` bytes.
                    unsafe { ptr.write_bytes(0xa5, layout.size()) };
                    ptr
                })
                .collect();
            for ptr in blocks {
                // SAFETY: allocated above with this layout.
                unsafe { a.dealloc(ptr, layout) };
            }
        }
    }

    #[test]
    fn zeroed_blocks_are_zero() {
        let a = MiMalloc;
        for layout in layouts() {
            // SAFETY: the layout's size is not zero.
            let ptr = unsafe { a.alloc_zeroed(layout) };
            assert_aligned(ptr, layout);
            // SAFETY: the block holds `layout.size()` initialised bytes.
            let bytes = unsafe { std::slice::from_raw_parts(ptr, layout.size()) };
            assert!(bytes.iter().all(|&b| b == 0), "{layout:?}: not zeroed");
            // SAFETY: allocated above with this layout.
            unsafe { a.dealloc(ptr, layout) };
        }
    }

    #[test]
    fn a_resized_block_keeps_its_bytes_and_alignment() {
        let a = MiMalloc;
        for layout in layouts() {
            for new_size in [1, layout.size() / 2 + 1, layout.size() * 3 + 5] {
                // SAFETY: the layout's size is not zero.
                let ptr = unsafe { a.alloc(layout) };
                assert_aligned(ptr, layout);
                for i in 0..layout.size() {
                    // SAFETY: within the block.
                    unsafe { ptr.add(i).write(i as u8) };
                }
                // SAFETY: `ptr` is this layout's block; `new_size` is not zero.
                let grown = unsafe { a.realloc(ptr, layout, new_size) };
                let moved = Layout::from_size_align(new_size, layout.align()).unwrap_or(layout);
                assert_aligned(grown, moved);
                for i in 0..layout.size().min(new_size) {
                    // SAFETY: within the resized block.
                    assert_eq!(unsafe { grown.add(i).read() }, i as u8, "{layout:?}");
                }
                // SAFETY: the resized block has the layout `moved`.
                unsafe { a.dealloc(grown, moved) };
            }
        }
    }
}
