/*
 * status.c - status strings, the thread-local error message, reasons.
 */
#include "internal.h"

#include <stdio.h>
#include <string.h>

static _Thread_local char ak_error_buf[AK_ERROR_LEN];

const char *ak_status_str(ak_status s)
{
    switch (s) {
#define AK_STATUS_CASE_(name, value, text)                                     \
    case name:                                                                 \
        return text;
        AK_STATUS_LIST(AK_STATUS_CASE_)
#undef AK_STATUS_CASE_
    }
    return "unknown status";
}

const char *ak_last_error(void) { return ak_error_buf; }

void ak_error_keep(ak_error_kept *k) { memcpy(k->text, ak_error_buf, sizeof k->text); }

void ak_error_restore(const ak_error_kept *k) { memcpy(ak_error_buf, k->text, sizeof ak_error_buf); }

ak_status ak_set_error(ak_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ak_error_buf, sizeof ak_error_buf, fmt, ap);
    va_end(ap);
    return s;
}

void ak_reason_add(ak_reasons *why, const char *fmt, ...)
{
    if (why->count < AK_MAX_REASONS) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why->text[why->count], AK_REASON_LEN, fmt, ap);
        va_end(ap);
    }
    why->count++;
}
