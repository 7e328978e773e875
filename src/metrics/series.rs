//! The series of one labelled family, resolved once for the label combinations that can occur: those that
//! occur routinely from start-up (so `rate()` and `absent()` see them at zero), rare ones when they first occur,
//! and impossible ones never (recording one is ignored: no series appears).

use super::possible::When;

/// Creates the series of one label combination.
type Make<T> = Box<dyn Fn(&[&str]) -> T + Send + Sync>;

/// A family's series in row-major order of its label value lists (the last list varies fastest).
pub(crate) struct Series<T> {
    slots: Vec<Slot<T>>,
    make: Make<T>,
}

enum Slot<T> {
    /// Created (at start-up, or when a rare combination first occurred).
    Ready(T),
    /// Rare: created on first use, from these label values.
    Rare(std::sync::OnceLock<T>, Vec<&'static str>),
    /// Cannot occur.
    Never,
}

impl<T> Series<T> {
    /// Every combination of `lists` that `when` does not rule out; those it calls [`When::Start`] are created now.
    pub fn new(
        lists: &[&[&'static str]],
        when: fn(&[&str]) -> When,
        make: impl Fn(&[&str]) -> T + Send + Sync + 'static,
    ) -> Self {
        let slots = combos(lists)
            .into_iter()
            .map(|labels| match when(&labels) {
                When::Start => Slot::Ready(make(&labels)),
                When::Rare => Slot::Rare(std::sync::OnceLock::new(), labels),
                When::Never => Slot::Never,
            })
            .collect();
        Series {
            slots,
            make: Box::new(make),
        }
    }

    /// The series at position `i` (see `super::at`); `None` for a combination that cannot occur.
    pub fn get(&self, i: usize) -> Option<&T> {
        match self.slots.get(i)? {
            Slot::Ready(t) => Some(t),
            Slot::Rare(cell, labels) => Some(cell.get_or_init(|| (self.make)(labels))),
            Slot::Never => None,
        }
    }
}

/// Every combination of the given label value lists, in row-major order (the last list varies fastest).
pub(crate) fn combos(lists: &[&[&'static str]]) -> Vec<Vec<&'static str>> {
    lists.iter().fold(vec![Vec::new()], |acc, values| {
        acc.iter()
            .flat_map(|prefix| {
                values.iter().map(move |v| {
                    let mut p = prefix.clone();
                    p.push(*v);
                    p
                })
            })
            .collect()
    })
}
