/* A small XML tree over expat, for AWS's answers: elements and their text, nothing else
 * (attributes, comments and processing instructions are dropped; entities are expat's, and a
 * DOCTYPE is refused so no entity can expand). */
#include <stdlib.h>
#include <string.h>

#include <expat.h>

#include "cloud/cloud_internal.h"

#define XML_MAX_DEPTH 64

typedef struct {
    td__xml *root;
    td__xml *stack[XML_MAX_DEPTH];
    int depth;
    int too_deep;
    int doctype;
    XML_Parser parser;
} builder;

static void XMLCALL on_start(void *ud, const XML_Char *name, const XML_Char **attrs) {
    (void)attrs;
    builder *b = ud;
    if (b->depth >= XML_MAX_DEPTH) {
        b->too_deep = 1;
        XML_StopParser(b->parser, XML_FALSE);
        return;
    }
    const char *local = strrchr(name, ':');
    td__xml *n = td_xcalloc(1, sizeof *n);
    n->name = td_xstrdup(local ? local + 1 : name);
    n->text = td_xstrdup("");
    if (b->depth == 0) {
        if (!b->root)
            b->root = n;
        else {
            free(n->name), free(n->text), free(n); /* a second root: expat rejects it anyway */
            return;
        }
    } else {
        td__xml *parent = b->stack[b->depth - 1];
        if (parent->last_child)
            parent->last_child->next = n;
        else
            parent->child = n;
        parent->last_child = n;
    }
    b->stack[b->depth++] = n;
}

static void XMLCALL on_end(void *ud, const XML_Char *name) {
    (void)name;
    builder *b = ud;
    if (b->depth > 0) b->depth--;
}

static void XMLCALL on_text(void *ud, const XML_Char *s, int len) {
    builder *b = ud;
    if (b->depth == 0 || len <= 0) return;
    td__xml *n = b->stack[b->depth - 1];
    n->text = td_xrealloc(n->text, n->text_nbytes + (size_t)len + 1);
    memcpy(n->text + n->text_nbytes, s, (size_t)len);
    n->text_nbytes += (size_t)len;
    n->text[n->text_nbytes] = '\0';
}

static void XMLCALL on_doctype(void *ud, const XML_Char *name, const XML_Char *sysid,
                               const XML_Char *pubid, int has_internal) {
    (void)name, (void)sysid, (void)pubid, (void)has_internal;
    builder *b = ud;
    b->doctype = 1;
    XML_StopParser(b->parser, XML_FALSE);
}

td_status td__xml_parse(const char *buf, size_t nbytes, td__xml **root_out) {
    *root_out = NULL;
    builder b = {0};
    b.parser = XML_ParserCreate("UTF-8");
    if (!b.parser) return td_error(TD_ERR_NOMEM, "expat: cannot create a parser");
    XML_SetUserData(b.parser, &b);
    XML_SetElementHandler(b.parser, on_start, on_end);
    XML_SetCharacterDataHandler(b.parser, on_text);
    XML_SetStartDoctypeDeclHandler(b.parser, on_doctype);
    enum XML_Status xs = XML_STATUS_OK;
    /* expat takes an int length: feed large bodies in pieces */
    size_t done = 0;
    do {
        size_t piece = TD_MIN(nbytes - done, (size_t)1 << 30);
        int final = done + piece == nbytes;
        xs = XML_Parse(b.parser, buf + done, (int)piece, final);
        done += piece;
    } while (xs == XML_STATUS_OK && done < nbytes);
    if (nbytes == 0) xs = XML_Parse(b.parser, "", 0, 1);
    td_status st = TD_OK;
    if (b.too_deep)
        st = td_error(TD_ERR_FORMAT, "XML answer nests deeper than %d elements", XML_MAX_DEPTH);
    else if (b.doctype)
        st = td_error(TD_ERR_FORMAT, "XML answer has a DOCTYPE, which AWS never sends");
    else if (xs != XML_STATUS_OK || !b.root)
        st = td_error(TD_ERR_FORMAT, "malformed XML at line %lu: %s",
                      (unsigned long)XML_GetCurrentLineNumber(b.parser),
                      b.root ? XML_ErrorString(XML_GetErrorCode(b.parser)) : "no element");
    XML_ParserFree(b.parser);
    if (st != TD_OK) {
        td__xml_free(b.root);
        return st;
    }
    *root_out = b.root;
    return TD_OK;
}

void td__xml_free(td__xml *n) {
    while (n) {
        td__xml *next = n->next;
        td__xml_free(n->child);
        free(n->name);
        free(n->text);
        free(n);
        n = next;
    }
}

const td__xml *td__xml_child(const td__xml *n, const char *name) {
    if (!n) return NULL;
    for (const td__xml *c = n->child; c; c = c->next)
        if (!strcmp(c->name, name)) return c;
    return NULL;
}

const td__xml *td__xml_path(const td__xml *n, const char *path) {
    char step[128];
    const char *p = path;
    while (n && *p) {
        const char *slash = strchr(p, '/');
        size_t len = slash ? (size_t)(slash - p) : strlen(p);
        if (len >= sizeof step) return NULL;
        memcpy(step, p, len);
        step[len] = '\0';
        n = td__xml_child(n, step);
        p += len + (slash != NULL);
    }
    return n;
}

const char *td__xml_text(const td__xml *n, const char *path) {
    const td__xml *t = td__xml_path(n, path);
    return t ? t->text : "";
}

void td__xml_copy(char *dst, size_t cap, const td__xml *n, const char *path) {
    snprintf(dst, cap, "%s", td__xml_text(n, path));
}
