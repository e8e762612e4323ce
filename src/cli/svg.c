/* SVG charts for the benchmark reports (see svg.h). Plain SVG 1.1 with
 * inline attributes, so the files render the same in browsers and on GitHub. */
#include "svg.h"

#include <errno.h>
#include <math.h>
#include <string.h>

#include "../base/base.h"

enum { PANEL_W = 440, PANEL_H = 320, M_LEFT = 70, M_RIGHT = 20, M_TOP = 36, M_BOTTOM = 50 };

static const char *const palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                      "#9467bd", "#8c564b", "#e377c2", "#17becf"};
#define PALETTE_N (int)(sizeof palette / sizeof palette[0])

static void xml_text(FILE *f, const char *s) {
    for (; s && *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}

static void text_at(FILE *f, double x, double y, const char *anchor, int size, const char *extra,
                    const char *s) {
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" font-size=\"%d\"%s%s>", x, y,
            anchor, size, extra ? " " : "", extra ? extra : "");
    xml_text(f, s);
    fputs("</text>\n", f);
}

double svg_nice_step(double span, int ticks) {
    if (!(span > 0) || !isfinite(span) || ticks < 1) return 1.0;
    double raw = span / ticks, mag = pow(10.0, floor(log10(raw))), r = raw / mag;
    double nice = r <= 1 ? 1 : r <= 2 ? 2 : r <= 5 ? 5 : 10;
    return nice * mag;
}

/* Value range over all series (finite values only); y always includes 0. */
static void y_range(const svg_chart *c, double *lo, double *hi) {
    *lo = 0;
    *hi = 0;
    for (int s = 0; s < c->n_series; s++)
        for (int i = 0; i < c->n_points; i++) {
            double v = c->y[s][i];
            if (!isfinite(v)) continue;
            if (v < *lo) *lo = v;
            if (v > *hi) *hi = v;
        }
    if (*hi <= *lo) *hi = *lo + 1;
}

static bool chart_ok(const svg_chart *c) {
    if (c->n_points < 1 || c->n_series < 1 || !c->y || !c->names) return false;
    if (c->bars ? !c->categories : !c->x) return false;
    for (int s = 0; s < c->n_series; s++)
        if (!c->y[s]) return false;
    if (!c->bars && c->log_x)
        for (int i = 0; i < c->n_points; i++)
            if (!(c->x[i] > 0)) return false;
    return true;
}

typedef struct frame {
    double left, top, width, height;   /* plot area */
    double x_lo, x_hi, y_lo, y_hi;
    bool log_x;
} frame;

static double map_x(const frame *fr, double x) {
    double a = fr->log_x ? log(x) : x, lo = fr->log_x ? log(fr->x_lo) : fr->x_lo,
           hi = fr->log_x ? log(fr->x_hi) : fr->x_hi;
    return fr->left + (hi > lo ? (a - lo) / (hi - lo) : 0.5) * fr->width;
}

static double map_y(const frame *fr, double y) {
    return fr->top + fr->height - (y - fr->y_lo) / (fr->y_hi - fr->y_lo) * fr->height;
}

static void y_axis(FILE *f, const frame *fr, const char *label) {
    double step = svg_nice_step(fr->y_hi - fr->y_lo, 5);
    for (double t = ceil(fr->y_lo / step) * step; t <= fr->y_hi + step * 1e-9; t += step) {
        double y = map_y(fr, t);
        char buf[32];
        snprintf(buf, sizeof buf, "%g", fabs(t) < step * 1e-9 ? 0.0 : t);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n",
                fr->left, y, fr->left + fr->width, y);
        text_at(f, fr->left - 6, y + 4, "end", 11, NULL, buf);
    }
    double cx = fr->left - 52, cy = fr->top + fr->height / 2;
    char rot[64];
    snprintf(rot, sizeof rot, "transform=\"rotate(-90 %.1f %.1f)\"", cx, cy);
    text_at(f, cx, cy, "middle", 12, rot, label ? label : "");
}

static void x_ticks_lines(FILE *f, const svg_chart *c, const frame *fr) {
    char buf[32];
    double base = fr->top + fr->height;
    if (fr->log_x) {
        for (int i = 0; i < c->n_points; i++) {
            double x = map_x(fr, c->x[i]);
            snprintf(buf, sizeof buf, "%g", c->x[i]);
            fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n",
                    x, base, x, base + 4);
            text_at(f, x, base + 16, "middle", 11, NULL, buf);
        }
        return;
    }
    double step = svg_nice_step(fr->x_hi - fr->x_lo, 6);
    for (double t = ceil(fr->x_lo / step) * step; t <= fr->x_hi + step * 1e-9; t += step) {
        double x = map_x(fr, t);
        snprintf(buf, sizeof buf, "%g", fabs(t) < step * 1e-9 ? 0.0 : t);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n", x,
                base, x, base + 4);
        text_at(f, x, base + 16, "middle", 11, NULL, buf);
    }
}

static void draw_lines(FILE *f, const svg_chart *c, const frame *fr) {
    for (int s = 0; s < c->n_series; s++) {
        const char *color = palette[s % PALETTE_N];
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", color);
        for (int i = 0; i < c->n_points; i++)
            if (isfinite(c->y[s][i]))
                fprintf(f, "%.1f,%.1f ", map_x(fr, c->x[i]), map_y(fr, c->y[s][i]));
        fputs("\"/>\n", f);
        for (int i = 0; i < c->n_points; i++)
            if (isfinite(c->y[s][i]))
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n",
                        map_x(fr, c->x[i]), map_y(fr, c->y[s][i]), color);
    }
}

static void draw_bars(FILE *f, const svg_chart *c, const frame *fr) {
    double group = fr->width / c->n_points, bar = group * 0.8 / c->n_series;
    double base = fr->top + fr->height;
    for (int i = 0; i < c->n_points; i++) {
        double gx = fr->left + group * i + group * 0.1;
        for (int s = 0; s < c->n_series; s++) {
            double v = c->y[s][i];
            if (!isfinite(v)) continue;
            double y0 = map_y(fr, 0), y1 = map_y(fr, v);
            fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"/>\n",
                    gx + bar * s, y1 < y0 ? y1 : y0, bar, fabs(y0 - y1),
                    palette[s % PALETTE_N]);
        }
        text_at(f, fr->left + group * (i + 0.5), base + 16, "middle", 11, NULL,
                c->categories[i]);
    }
}

static void legend(FILE *f, const svg_chart *c, const frame *fr) {
    for (int s = 0; s < c->n_series; s++) {
        double x = fr->left + 8, y = fr->top + 8 + 16 * s;
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"12\" height=\"10\" fill=\"%s\"/>\n", x, y,
                palette[s % PALETTE_N]);
        text_at(f, x + 16, y + 9, "start", 11, NULL, c->names[s] ? c->names[s] : "");
    }
}

static void draw_chart(FILE *f, const svg_chart *c, double x0) {
    frame fr = {x0 + M_LEFT, M_TOP, PANEL_W - M_LEFT - M_RIGHT, PANEL_H - M_TOP - M_BOTTOM,
                0, 1, 0, 1, !c->bars && c->log_x};
    double lo, hi;
    y_range(c, &lo, &hi);
    /* headroom above the data for the legend in the top-left corner */
    double legend_frac = (14.0 + 16.0 * c->n_series) / fr.height;
    if (legend_frac > 0.6) legend_frac = 0.6;
    double top = lo + (hi - lo) / (1 - legend_frac);
    double step = svg_nice_step(top - lo, 5);
    fr.y_lo = floor(lo / step) * step;
    fr.y_hi = ceil(top / step) * step;
    if (!c->bars) {
        fr.x_lo = fr.x_hi = c->x[0];
        for (int i = 1; i < c->n_points; i++) {
            if (c->x[i] < fr.x_lo) fr.x_lo = c->x[i];
            if (c->x[i] > fr.x_hi) fr.x_hi = c->x[i];
        }
        if (!fr.log_x && fr.x_hi <= fr.x_lo) fr.x_hi = fr.x_lo + 1;
    }
    text_at(f, x0 + PANEL_W / 2.0, 20, "middle", 14, "font-weight=\"bold\"", c->title);
    y_axis(f, &fr, c->y_label);
    if (c->bars) draw_bars(f, c, &fr);
    else {
        x_ticks_lines(f, c, &fr);
        draw_lines(f, c, &fr);
    }
    double base = fr.top + fr.height;
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n",
            fr.left, base, fr.left + fr.width, base);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n",
            fr.left, fr.top, fr.left, base);
    text_at(f, fr.left + fr.width / 2, base + 38, "middle", 12, NULL,
            c->x_label ? c->x_label : "");
    legend(f, c, &fr);
}

int svg_write(FILE *f, const svg_chart *charts, int n_charts) {
    if (n_charts < 1) return -1;
    for (int i = 0; i < n_charts; i++)
        if (!chart_ok(&charts[i])) return -1;
    int width = PANEL_W * n_charts;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
               "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\">\n",
            width, PANEL_H, width, PANEL_H);
    fprintf(f, "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"white\"/>\n", width,
            PANEL_H);
    for (int i = 0; i < n_charts; i++) draw_chart(f, &charts[i], (double)PANEL_W * i);
    fputs("</svg>\n", f);
    return 0;
}

int svg_save(const char *path, const svg_chart *charts, int n_charts, lp_error *err) {
    FILE *f = fopen(path, "w");
    if (!f) return lp_error_set(err, LP_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    int rc = svg_write(f, charts, n_charts);
    if (fclose(f) != 0 && rc == 0) return lp_fail(err, "%s: write failed", path);
    if (rc) return lp_fail(err, "%s: malformed chart (no points or series)", path);
    return 0;
}
