/* core: status messages, error details and traces, arena bounds, Philox known answers. */
#include "test.h"

static td_status fails_deep(void) {
    return td_error(TD_ERR_FORMAT, "file %s: bad magic 0x%08x", "x.idx", 0x1234u);
}

static td_status fails_through_check(void) {
    TD_CHECK(fails_deep());
    return TD_OK;
}

int main(void) {
    /* statuses and their text */
    ASSERT_STREQ(td_status_str(TD_OK), "ok");
    ASSERT_STREQ(td_status_name(TD_ERR_TIMEOUT), "TD_ERR_TIMEOUT");
    ASSERT_STREQ(td_status_str((td_status)999), "unknown status");

    /* an error keeps its detail and gains a frame per TD_CHECK */
    ASSERT_STATUS(fails_through_check(), TD_ERR_FORMAT);
    ASSERT_STREQ(td_error_msg(), "file x.idx: bad magic 0x00001234");
    ASSERT_CONTAINS(td_error_trace(), "fails_deep()");
    td_error_clear();
    ASSERT_STREQ(td_error_msg(), "");

    /* arena: aligned, bounded, reports overflow as NULL */
    td_arena arena;
    td_arena_init(&arena, 256);
    void *a = td_arena_alloc(&arena, 10);
    void *b = td_arena_alloc(&arena, 100);
    ASSERT(a && b);
    ASSERT_EQ((uintptr_t)b % 64, 0);
    ASSERT(td_arena_alloc(&arena, 200) == NULL);
    td_arena_reset(&arena);
    ASSERT(td_arena_alloc(&arena, 200) != NULL);
    td_arena_free(&arena);

    /* Philox4x32-10 known-answer vectors from the Random123 distribution (kat_vectors). */
    td_philox_ctr zero = {{0, 0, 0, 0}};
    td_philox_ctr r = td_philox4x32(0, zero);
    ASSERT_EQ(r.v[0], 0x6627e8d5u);
    ASSERT_EQ(r.v[1], 0xe169c58du);
    ASSERT_EQ(r.v[2], 0xbc57ac4cu);
    ASSERT_EQ(r.v[3], 0x9b00dbd8u);
    td_philox_ctr ones = {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}};
    r = td_philox4x32(0xffffffffffffffffull, ones);
    ASSERT_EQ(r.v[0], 0x408f276du);
    ASSERT_EQ(r.v[1], 0x41c83b0eu);
    ASSERT_EQ(r.v[2], 0xa20bc7c6u);
    ASSERT_EQ(r.v[3], 0x6d5451fdu);

    /* uniform floats: in range, reproducible, mean near 1/2, fill agrees with single draws */
    float buf[1001];
    td_rng_fill_uniform(42, 7, 0.0f, 1.0f, buf, 1001);
    double mean = 0;
    for (int i = 0; i < 1001; i++) {
        ASSERT(buf[i] >= 0.0f && buf[i] < 1.0f);
        ASSERT(buf[i] == td_rng_uniform(42, 7, (uint64_t)i));
        mean += buf[i];
    }
    ASSERT_NEAR(mean / 1001, 0.5, 0.05);
    ASSERT(td_rng_uniform(42, 8, 0) != td_rng_uniform(42, 7, 0));

    /* parsing */
    int64_t v;
    ASSERT_OK(td_parse_i64("--steps", "123", &v));
    ASSERT_EQ(v, 123);
    ASSERT_STATUS(td_parse_i64("--steps", "12x", &v), TD_ERR_INVALID);
    ASSERT_CONTAINS(td_error_msg(), "--steps");
    double d;
    ASSERT_STATUS(td_parse_f64("--lr", "nan", &d), TD_ERR_INVALID);

    /* CRC-32 of "123456789" is the standard check value */
    ASSERT_EQ(td_crc32(0, "123456789", 9), 0xCBF43926u);
    /* a peer's text reaches a terminal escaped (issue 8: a stranger's "failed" key was printed
     * with its terminal escapes), and a long one is cut with "..." */
    char esc[32];
    ASSERT_STREQ(td_escape_text(esc, sizeof esc, "ok \x1b[2J\\n\x01", 10),
                 "ok \\x1b[2J\\x5cn\\x01");
    ASSERT_STREQ(td_escape_text(esc, 12, "0123456789abcdef", 16), "01234567...");
    ASSERT_STREQ(td_escape_text(esc, sizeof esc, "", 0), "");
    TEST_PASS();
}
