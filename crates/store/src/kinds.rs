//! One value per kind of a small closed set ([`PerKind`]), indexed by the kind, never by a
//! position: a client's limits by `{resource, window}`, the queue's classes.

use std::marker::PhantomData;
use std::ops::{Index, IndexMut};

/// A kind of a closed set: every kind in [`Key::ALL`], each at its own [`Key::index`].
pub trait Key: Copy + 'static {
    /// Every kind, each at its index.
    const ALL: &'static [Self];
    /// Its place in [`Key::ALL`].
    fn index(self) -> usize;
}

/// A value for each kind `K` (`N`: how many kinds there are, `K::ALL.len()`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PerKind<K, T, const N: usize> {
    values: [T; N],
    kind: PhantomData<K>,
}

impl<K: Key, T, const N: usize> PerKind<K, T, N> {
    /// The value of each kind as `f` gives it.
    pub fn from_fn(mut f: impl FnMut(K) -> T) -> Self {
        PerKind {
            values: std::array::from_fn(|i| f(K::ALL[i])),
            kind: PhantomData,
        }
    }

    /// Each kind with its value.
    pub fn iter(&self) -> impl Iterator<Item = (K, &T)> {
        K::ALL.iter().copied().zip(&self.values)
    }

    /// Each kind with its value, to change.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (K, &mut T)> {
        K::ALL.iter().copied().zip(&mut self.values)
    }

    /// The same kinds, each value as `f` makes it of the kind and its value.
    pub fn map<U>(&self, mut f: impl FnMut(K, &T) -> U) -> PerKind<K, U, N> {
        PerKind::from_fn(|k| f(k, &self[k]))
    }
}

impl<K: Key, T: Default, const N: usize> Default for PerKind<K, T, N> {
    fn default() -> Self {
        PerKind::from_fn(|_| T::default())
    }
}

impl<K: Key, T, const N: usize> Index<K> for PerKind<K, T, N> {
    type Output = T;

    fn index(&self, kind: K) -> &T {
        &self.values[kind.index()]
    }
}

impl<K: Key, T, const N: usize> IndexMut<K> for PerKind<K, T, N> {
    fn index_mut(&mut self, kind: K) -> &mut T {
        &mut self.values[kind.index()]
    }
}

impl<K: Key + std::fmt::Debug, T: std::fmt::Debug, const N: usize> std::fmt::Debug
    for PerKind<K, T, N>
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Colour {
        Red,
        Green,
    }

    impl Key for Colour {
        const ALL: &'static [Colour] = &[Colour::Red, Colour::Green];
        fn index(self) -> usize {
            self as usize
        }
    }

    #[test]
    fn each_kind_holds_its_own_value() {
        let mut m: PerKind<Colour, u32, 2> = PerKind::from_fn(|c| c as u32 + 10);
        m[Colour::Green] += 5;
        assert_eq!((m[Colour::Red], m[Colour::Green]), (10, 16));
        let doubled = m.map(|_, v| v * 2);
        let all: Vec<_> = doubled.iter().map(|(k, v)| (k, *v)).collect();
        assert_eq!(all, [(Colour::Red, 20), (Colour::Green, 32)]);
        assert_eq!(format!("{m:?}"), "{Red: 10, Green: 16}");
        assert_eq!(PerKind::<Colour, u8, 2>::default()[Colour::Green], 0);
    }
}
