//! Log timestamps as the default timer writes them (RFC 3339, UTC, microseconds), with the date and time of day
//! formatted once per second per thread instead of once per line.

use std::cell::RefCell;
use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::FormatTime;

/// `YYYY-MM-DDTHH:MM:SS.ffffffZ`, the exact text of `tracing_subscriber`'s `SystemTime` timer.
#[derive(Clone, Copy, Debug, Default)]
pub struct Clock;

thread_local! {
    /// The second last formatted on this thread and its text up to the `.`.
    static SECOND: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
}

impl FormatTime for Clock {
    fn format_time(&self, w: &mut Writer<'_>) -> fmt::Result {
        let Ok(since) = SystemTime::now().duration_since(UNIX_EPOCH) else {
            // Before 1970: not worth a cache.
            return tracing_subscriber::fmt::time::SystemTime.format_time(w);
        };
        let secs = since.as_secs();
        SECOND.with(|s| {
            let mut s = s.borrow_mut();
            if s.0 != secs {
                s.1.clear();
                write_second(&mut s.1, secs)?;
                s.0 = secs;
            }
            w.write_str(&s.1)
        })?;
        let micros = since.subsec_micros();
        let mut digits = [b'0'; 6];
        let mut buf = itoa::Buffer::new();
        let text = buf.format(micros).as_bytes();
        digits[6 - text.len()..].copy_from_slice(text);
        w.write_str(std::str::from_utf8(&digits).map_err(|_| fmt::Error)?)?;
        w.write_char('Z')
    }
}

/// `YYYY-MM-DDTHH:MM:SS.` of `secs` since the Unix epoch.
fn write_second(out: &mut impl fmt::Write, secs: u64) -> fmt::Result {
    let days = i64::try_from(secs / 86_400).map_err(|_| fmt::Error)?;
    let rem = secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    if year > 9999 {
        write!(out, "+{year}")?;
    } else {
        write!(out, "{year:04}")?;
    }
    write!(
        out,
        "-{month:02}-{day:02}T{:02}:{:02}:{:02}.",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// The proleptic Gregorian date of `days` since 1970-01-01 (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11]
    let day = doy - (153 * mp + 2) / 5 + 1; // [1, 31]
    let month = if mp < 10 { mp + 3 } else { mp - 9 }; // [1, 12]
    let year = yoe + era * 400 + i64::from(month <= 2);
    (
        year,
        u32::try_from(month).unwrap_or(1),
        u32::try_from(day).unwrap_or(1),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn second(secs: u64) -> String {
        let mut s = String::new();
        write_second(&mut s, secs).unwrap();
        s
    }

    #[test]
    fn known_instants() {
        assert_eq!(second(0), "1970-01-01T00:00:00.");
        assert_eq!(second(951_782_400), "2000-02-29T00:00:00.");
        assert_eq!(second(951_868_799), "2000-02-29T23:59:59.");
        assert_eq!(second(1_798_761_599), "2026-12-31T23:59:59.");
        assert_eq!(second(4_107_542_400), "2100-03-01T00:00:00.");
        assert_eq!(second(253_402_300_800), "+10000-01-01T00:00:00.");
    }

    #[test]
    fn the_same_text_as_the_default_timer() {
        // Both read the clock: compare the lines of a pair taken within one second (all but the microseconds).
        let mut compared = 0;
        for _ in 0..1000 {
            let (mut ours, mut theirs) = (String::new(), String::new());
            Clock.format_time(&mut Writer::new(&mut ours)).unwrap();
            tracing_subscriber::fmt::time::SystemTime
                .format_time(&mut Writer::new(&mut theirs))
                .unwrap();
            assert_eq!(ours.len(), theirs.len(), "{ours} / {theirs}");
            assert!(ours.ends_with('Z') && ours.as_bytes()[ours.len() - 8] == b'.');
            if ours[..ours.len() - 7] == theirs[..theirs.len() - 7] {
                compared += 1;
            }
        }
        // A second boundary can fall between the two readings only rarely.
        assert!(compared > 900, "{compared} of 1000 pairs agreed");
    }

    #[test]
    fn every_day_of_four_centuries_matches_a_day_counter() {
        // Walk day by day from 1970 and check each date against a simple calendar count.
        let (mut y, mut m, mut d) = (1970i64, 1u32, 1u32);
        for days in 0..146_097 {
            assert_eq!(civil_from_days(days), (y, m, d), "day {days}");
            let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
            let len = [
                31,
                if leap { 29 } else { 28 },
                31,
                30,
                31,
                30,
                31,
                31,
                30,
                31,
                30,
                31,
            ];
            d += 1;
            if d > len[(m - 1) as usize] {
                d = 1;
                m += 1;
                if m > 12 {
                    m = 1;
                    y += 1;
                }
            }
        }
    }
}
