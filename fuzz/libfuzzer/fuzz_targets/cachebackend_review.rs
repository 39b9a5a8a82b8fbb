#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ic_fuzz::cachebackend_review(data));
