/* A tiny SVG chart writer for benchmark plots: line charts (values over x)
 * and grouped bar charts (values over named categories), with axes, ticks,
 * labels and a legend. Several charts go side by side in one document.
 * Depends on nothing but stdio. */
#ifndef LP_CLI_SVG_H
#define LP_CLI_SVG_H

#include <stdbool.h>
#include <stdio.h>

#include "loraplex.h"

typedef struct svg_chart {
    const char *title, *x_label, *y_label;
    bool bars;                      /* grouped bars over categories, else lines over x */
    bool log_x;                     /* lines: logarithmic x axis, ticked at the data's x */
    int n_points;                   /* x values (lines) or categories (bars) */
    const double *x;                /* lines: n_points x values */
    const char *const *categories;  /* bars: n_points names */
    int n_series;
    const char *const *names;       /* n_series legend entries */
    const double *const *y;         /* n_series arrays of n_points values; NaN = no value */
} svg_chart;

/* Writes the charts side by side as one SVG document. Returns 0, or -1 if a
 * chart is malformed (no points, no series, missing arrays). */
int svg_write(FILE *f, const svg_chart *charts, int n_charts);
/* svg_write into a file. */
int svg_save(const char *path, const svg_chart *charts, int n_charts, lp_error *err);

/* A "nice" tick step (1, 2 or 5 times a power of ten) giving about `ticks`
 * intervals over span. */
double svg_nice_step(double span, int ticks);

#endif
