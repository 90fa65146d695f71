/* The built-in default corpus (see corpus.h): paragraphs of templated English
 * generated from small word lists with the counter-based RNG, so the text is
 * identical on every machine and every run.
 *
 * The kinds of paragraph are chosen to give a small byte-level model
 * something to learn at several levels: spelling of a closed vocabulary
 * (fast), sentence templates and subject-verb agreement (medium), and facts
 * that can only be predicted by remembering them or by arithmetic (slow). */
#include "corpus.h"

#include <stdlib.h>
#include <string.h>

#include "base/mal.h"
#include "base/rng.h"

#define CORPUS_SEED 0x436F727075733031ull /* fixed: the corpus never changes */

typedef struct {
    char *buf;
    size_t len, cap;
    uint64_t draw; /* index of the next random draw */
    int oom;
} gen;

static uint64_t rnd(gen *g, uint64_t n)
{
    return mal_rng_below(CORPUS_SEED, 0, g->draw++, n);
}

#define PICK(g, list) ((list)[rnd((g), MAL_ARRAY_SIZE(list))])

static void put_n(gen *g, const char *s, size_t n)
{
    if (g->oom) return;
    if (g->len + n + 1 > g->cap) {
        size_t ncap = g->cap * 2 + n + 1;
        char *p = realloc(g->buf, ncap);
        if (!p) {
            g->oom = 1;
            return;
        }
        g->buf = p;
        g->cap = ncap;
    }
    memcpy(g->buf + g->len, s, n);
    g->len += n;
}

static void put(gen *g, const char *s)
{
    put_n(g, s, strlen(s));
}

/* Upper-case the first letter written since `start` (a sentence start). */
static void capitalize_from(gen *g, size_t start)
{
    if (g->oom || start >= g->len) return;
    char c = g->buf[start];
    if (c >= 'a' && c <= 'z') g->buf[start] = (char)(c - 'a' + 'A');
}

/* ---- vocabulary ------------------------------------------------------- */

static const char *const ones[] = {"zero",    "one",     "two",       "three",    "four",
                                   "five",    "six",     "seven",     "eight",    "nine",
                                   "ten",     "eleven",  "twelve",    "thirteen", "fourteen",
                                   "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"};
static const char *const tens[] = {"",      "",      "twenty",  "thirty", "forty",
                                   "fifty", "sixty", "seventy", "eighty", "ninety"};

/* A number 0..99 in words ("forty-two"). */
static void put_number(gen *g, int v)
{
    if (v < 20) {
        put(g, ones[v]);
        return;
    }
    put(g, tens[v / 10]);
    if (v % 10) {
        put(g, "-");
        put(g, ones[v % 10]);
    }
}

typedef struct {
    const char *one, *many;
} noun;

static const noun nouns[] = {
    {"cat", "cats"},       {"dog", "dogs"},     {"bird", "birds"},       {"fox", "foxes"},
    {"child", "children"}, {"mouse", "mice"},   {"box", "boxes"},        {"tree", "trees"},
    {"ball", "balls"},     {"book", "books"},   {"horse", "horses"},     {"fish", "fish"},
    {"baby", "babies"},    {"apple", "apples"}, {"teacher", "teachers"}, {"robot", "robots"},
};

typedef struct {
    const char *base, *third; /* "they see", "it sees" */
} verb;

static const verb verbs[] = {
    {"see", "sees"},      {"chase", "chases"},  {"like", "likes"},  {"find", "finds"},
    {"watch", "watches"}, {"carry", "carries"}, {"push", "pushes"}, {"follow", "follows"},
    {"want", "wants"},    {"help", "helps"},    {"draw", "draws"},  {"catch", "catches"},
};

static const char *const adjectives[] = {"big",   "small", "red",   "blue", "green",  "old",
                                         "young", "happy", "quick", "lazy", "bright", "quiet"};
static const char *const names[] = {"alice", "bob",   "carol", "dave",
                                    "emma",  "frank", "grace", "henry"};
static const char *const places[] = {"garden",  "house", "park",   "forest",
                                     "kitchen", "river", "school", "market"};
static const char *const pets[] = {"cat", "dog", "bird", "fox", "mouse", "fish", "horse"};
static const char *const cities[] = {"paris", "tokyo", "cairo", "lima", "oslo", "delhi"};
static const char *const days[] = {"monday", "tuesday",  "wednesday", "thursday",
                                   "friday", "saturday", "sunday"};
static const char *const months[] = {"january",   "february", "march",    "april",
                                     "may",       "june",     "july",     "august",
                                     "september", "october",  "november", "december"};

typedef struct {
    const char *statement, *question, *answer;
} fact;

/* Fixed facts: the same question always has the same answer, so a model can
 * only predict the answer by remembering it. */
static const fact facts[] = {
    {"the sky is blue.", "what color is the sky?", "blue"},
    {"grass is green.", "what color is grass?", "green"},
    {"snow is white.", "what color is snow?", "white"},
    {"coal is black.", "what color is coal?", "black"},
    {"a cow says moo.", "what does a cow say?", "moo"},
    {"a dog says woof.", "what does a dog say?", "woof"},
    {"a cat says meow.", "what does a cat say?", "meow"},
    {"a duck says quack.", "what does a duck say?", "quack"},
    {"the opposite of hot is cold.", "what is the opposite of hot?", "cold"},
    {"the opposite of up is down.", "what is the opposite of up?", "down"},
    {"the opposite of big is small.", "what is the opposite of big?", "small"},
    {"the opposite of day is night.", "what is the opposite of day?", "night"},
    {"paris is the capital of france.", "what is the capital of france?", "paris"},
    {"rome is the capital of italy.", "what is the capital of italy?", "rome"},
    {"tokyo is the capital of japan.", "what is the capital of japan?", "tokyo"},
    {"a week has seven days.", "how many days does a week have?", "seven"},
    {"a year has twelve months.", "how many months does a year have?", "twelve"},
    {"a spider has eight legs.", "how many legs does a spider have?", "eight"},
};

/* ---- sentences -------------------------------------------------------- */

/* "the red fox chases the dogs." with agreement between subject and verb. */
static void sentence_story(gen *g)
{
    size_t start = g->len;
    const noun *s = &PICK(g, nouns);
    const verb *v = &PICK(g, verbs);
    int plural = (int)rnd(g, 2);
    switch (rnd(g, 6)) {
    case 0: /* the [adj] subject verb the [adj] object. */
        put(g, "the ");
        if (rnd(g, 2)) {
            put(g, PICK(g, adjectives));
            put(g, " ");
        }
        put(g, plural ? s->many : s->one);
        put(g, " ");
        put(g, plural ? v->base : v->third);
        put(g, " the ");
        if (rnd(g, 2)) {
            put(g, PICK(g, adjectives));
            put(g, " ");
        }
        {
            const noun *o = &PICK(g, nouns);
            put(g, rnd(g, 2) ? o->many : o->one);
        }
        put(g, ".");
        break;
    case 1: /* name verbs the object in the place. */
        put(g, PICK(g, names));
        put(g, " ");
        put(g, v->third);
        put(g, " the ");
        put(g, plural ? s->many : s->one);
        put(g, " in the ");
        put(g, PICK(g, places));
        put(g, ".");
        break;
    case 2: /* name has N nouns. */
    {
        int k = (int)rnd(g, 12);
        put(g, PICK(g, names));
        put(g, " has ");
        put_number(g, k);
        put(g, " ");
        put(g, k == 1 ? s->one : s->many);
        put(g, ".");
        break;
    }
    case 3: /* the noun is adj. / the nouns are adj. */
        put(g, "the ");
        put(g, plural ? s->many : s->one);
        put(g, plural ? " are " : " is ");
        put(g, PICK(g, adjectives));
        put(g, ".");
        break;
    case 4: /* on day, name and another name go to the place. */
    {
        size_t a = (size_t)rnd(g, MAL_ARRAY_SIZE(names));
        size_t b = (a + 1 + (size_t)rnd(g, MAL_ARRAY_SIZE(names) - 1)) % MAL_ARRAY_SIZE(names);
        put(g, "on ");
        put(g, PICK(g, days));
        put(g, " ");
        put(g, names[a]);
        put(g, " and ");
        put(g, names[b]);
        put(g, " go to the ");
        put(g, PICK(g, places));
        put(g, ".");
        break;
    }
    default: /* when the noun verbs, the other noun runs away. */
        put(g, "when the ");
        put(g, s->one);
        put(g, " ");
        put(g, v->third);
        put(g, " the ");
        put(g, PICK(g, nouns).many);
        put(g, ", they run to the ");
        put(g, PICK(g, places));
        put(g, ".");
        break;
    }
    capitalize_from(g, start);
}

/* "seven plus five is twelve." (all results 0..99) */
static void put_arith(gen *g, int as_question)
{
    int a, b, r;
    const char *op;
    switch (rnd(g, 3)) {
    case 0:
        a = (int)rnd(g, 13);
        b = (int)rnd(g, 13);
        op = " plus ";
        r = a + b;
        break;
    case 1:
        a = (int)rnd(g, 21);
        b = (int)rnd(g, (uint64_t)a + 1);
        op = " minus ";
        r = a - b;
        break;
    default:
        a = (int)rnd(g, 10);
        b = (int)rnd(g, 10);
        op = " times ";
        r = a * b;
        break;
    }
    if (as_question) put(g, "q: what is ");
    size_t start = g->len;
    put_number(g, a);
    put(g, op);
    put_number(g, b);
    if (as_question) {
        put(g, "? a: ");
        put_number(g, r);
        put(g, ".");
        return;
    }
    put(g, " is ");
    put_number(g, r);
    put(g, ".");
    capitalize_from(g, start);
}

/* ---- paragraphs ------------------------------------------------------- */

static void para_story(gen *g)
{
    int n = 3 + (int)rnd(g, 5);
    for (int i = 0; i < n; i++) {
        if (i) put(g, " ");
        sentence_story(g);
    }
}

static void para_arith(gen *g)
{
    int n = 4 + (int)rnd(g, 5);
    for (int i = 0; i < n; i++) {
        if (i) put(g, " ");
        put_arith(g, 0);
    }
}

static void para_facts(gen *g)
{
    int n = 3 + (int)rnd(g, 4);
    for (int i = 0; i < n; i++) {
        if (i) put(g, " ");
        size_t start = g->len;
        put(g, PICK(g, facts).statement);
        capitalize_from(g, start);
    }
}

/* key: value records, one per line. */
static void para_records(gen *g)
{
    int n = 2 + (int)rnd(g, 3);
    for (int i = 0; i < n; i++) {
        if (i) put(g, "\n");
        put(g, "name: ");
        put(g, PICK(g, names));
        put(g, "; age: ");
        put_number(g, 5 + (int)rnd(g, 80));
        put(g, "; city: ");
        put(g, PICK(g, cities));
        put(g, "; pet: ");
        put(g, PICK(g, pets));
        put(g, ".");
    }
}

/* Ordered lists: counting up or down, days, months, letters. */
static void para_list(gen *g)
{
    int len = 4 + (int)rnd(g, 6);
    switch (rnd(g, 5)) {
    case 0: {
        int from = (int)rnd(g, 90);
        put(g, "counting: ");
        for (int i = 0; i < len; i++) {
            if (i) put(g, ", ");
            put_number(g, from + i);
        }
        break;
    }
    case 1: {
        int from = len + (int)rnd(g, (uint64_t)(99 - len));
        put(g, "counting down: ");
        for (int i = 0; i < len; i++) {
            if (i) put(g, ", ");
            put_number(g, from - i);
        }
        break;
    }
    case 2: {
        size_t from = (size_t)rnd(g, MAL_ARRAY_SIZE(days));
        put(g, "days: ");
        for (int i = 0; i < len; i++) {
            if (i) put(g, ", ");
            put(g, days[(from + (size_t)i) % MAL_ARRAY_SIZE(days)]);
        }
        break;
    }
    case 3: {
        size_t from = (size_t)rnd(g, MAL_ARRAY_SIZE(months));
        put(g, "months: ");
        for (int i = 0; i < len; i++) {
            if (i) put(g, ", ");
            put(g, months[(from + (size_t)i) % MAL_ARRAY_SIZE(months)]);
        }
        break;
    }
    default: {
        int from = (int)rnd(g, (uint64_t)(26 - len));
        put(g, "letters:");
        for (int i = 0; i < len; i++) {
            char c[3] = {' ', (char)('a' + from + i), '\0'};
            put(g, c);
        }
        break;
    }
    }
    put(g, ".");
}

/* Question and answer lines about arithmetic and the fixed facts. */
static void para_qa(gen *g)
{
    int n = 2 + (int)rnd(g, 4);
    for (int i = 0; i < n; i++) {
        if (i) put(g, "\n");
        if (rnd(g, 2)) {
            put_arith(g, 1);
        } else {
            const fact *f = &PICK(g, facts);
            put(g, "q: ");
            put(g, f->question);
            put(g, " a: ");
            put(g, f->answer);
            put(g, ".");
        }
    }
}

/* Run the generator to the first paragraph end at or after `train_bytes`
 * (the corpus; it ends at *split) and on to the first one at least
 * `extra_bytes` after that. */
static int generate(size_t train_bytes, size_t extra_bytes, char **text, size_t *len, size_t *split)
{
    /* Paragraph kinds, weighted: prose and arithmetic dominate. */
    static void (*const kinds[])(gen *) = {para_story, para_story, para_story,   para_arith,
                                           para_arith, para_facts, para_records, para_list,
                                           para_qa,    para_qa};
    gen g = {0};
    *text = NULL;
    *len = 0;
    g.cap = train_bytes + extra_bytes + 4096;
    g.buf = malloc(g.cap);
    if (!g.buf)
        return MAL_ERR(MAL_ENOMEM, "out of memory generating the built-in corpus (%zu bytes)",
                       g.cap);
    *split = 0;
    while ((!*split || g.len < *split + extra_bytes) && !g.oom) {
        PICK(&g, kinds)(&g);
        put(&g, "\n\n");
        if (!*split && g.len >= train_bytes) *split = g.len;
    }
    if (g.oom) {
        free(g.buf);
        return MAL_ERR(MAL_ENOMEM, "out of memory generating the built-in corpus");
    }
    g.buf[g.len] = '\0'; /* put_n always leaves room for it */
    *text = g.buf;
    *len = g.len;
    return 0;
}

int mal_corpus_generate(char **text, size_t *len)
{
    size_t split;
    return generate(MAL_CORPUS_TARGET_BYTES, 0, text, len, &split);
}

int mal_corpus_generate_heldout(char **text, size_t *len)
{
    char *all;
    size_t n, split;
    int rc = generate(MAL_CORPUS_TARGET_BYTES, MAL_CORPUS_HELDOUT_BYTES, &all, &n, &split);
    if (rc) return rc;
    /* the tail moves to the front of the buffer; the corpus part is dropped */
    memmove(all, all + split, n - split + 1);
    *text = all;
    *len = n - split;
    return 0;
}
