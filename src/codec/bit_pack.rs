//! Packing of small codes (1, 2 or 4 bits each) into bytes, shared by the dense parameter codes
//! ([`super::sign_code`]) and the second-moment codes of [`super::merge_delta`].
//!
//! With width `w`, a byte holds `8 / w` codes; code `i` sits in bits `w * (i % (8 / w))` and up
//! of byte `i / (8 / w)`, starting from the least significant bit. The bits after the last code
//! of a run are padding and must be zero, so every run of codes has one encoding.

/// Bytes holding `len` codes of `width` bits.
pub(crate) fn packed_len(len: u64, width: usize) -> u64 {
    len.div_ceil((8 / width) as u64)
}

/// Appends `codes` (each below `2^width`) packed at `width` bits.
pub(crate) fn pack(codes: impl IntoIterator<Item = u8>, width: usize, out: &mut Vec<u8>) {
    let per_byte = 8 / width;
    let (mut byte, mut held) = (0u8, 0usize);
    for code in codes {
        byte |= code << (width * held);
        held += 1;
        if held == per_byte {
            out.push(byte);
            (byte, held) = (0, 0);
        }
    }
    if held > 0 {
        out.push(byte);
    }
}

/// The first `len` codes packed at `width` bits in `bytes` (which must hold them), in order.
pub(crate) fn codes(bytes: &[u8], width: usize, len: usize) -> impl Iterator<Item = u8> + '_ {
    let per_byte = 8 / width;
    let mask = (1u8 << width) - 1;
    bytes
        .iter()
        .flat_map(move |&b| (0..per_byte).map(move |k| (b >> (width * k)) & mask))
        .take(len)
}

/// Whether the padding bits after the last of `len` codes packed at `width` bits are zero.
pub(crate) fn padding_is_clear(bytes: &[u8], width: usize, len: usize) -> bool {
    let per_byte = 8 / width;
    let used = len % per_byte;
    used == 0 || bytes[len / per_byte] >> (width * used) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_pack_from_the_least_significant_bit_and_read_back() {
        let mut out = Vec::new();
        pack([1, 0, 1, 1, 0, 0, 0, 1, 1], 1, &mut out);
        assert_eq!(out, vec![0b1000_1101, 0b1]);
        assert_eq!(packed_len(9, 1), 2);
        let mut out = Vec::new();
        pack([3, 1, 2], 2, &mut out);
        assert_eq!(out, vec![0b10_01_11]);
        let mut out = Vec::new();
        pack([0xA, 0x5, 0xF], 4, &mut out);
        assert_eq!(out, vec![0x5A, 0x0F]);
        assert_eq!(codes(&out, 4, 3).collect::<Vec<_>>(), vec![0xA, 0x5, 0xF]);
        assert_eq!(
            codes(&[0b10_01_11], 2, 3).collect::<Vec<_>>(),
            vec![3, 1, 2]
        );
        assert!(padding_is_clear(&out, 4, 3));
        out[1] |= 0x10;
        assert!(!padding_is_clear(&out, 4, 3));
        assert!(padding_is_clear(&[0xFF], 2, 4));
    }
}
