package main

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"

	"github.com/lockstep-dev/lockstep/test/workloads"
)

// The chart: one bar per row that has a goal, the share of the unprotected figure that protection
// keeps (1: no cost), with the goal marked; green where it is met, red where it is missed.
const (
	labelWidth = 430
	barWidth   = 400 // the bar of a share of 1
	rowHeight  = 22
	top        = 44
	maxShare   = 1.25
)

var (
	white  = color.RGBA{255, 255, 255, 255}
	black  = color.RGBA{0, 0, 0, 255}
	grey   = color.RGBA{170, 170, 170, 255}
	green  = color.RGBA{46, 139, 87, 255}
	red    = color.RGBA{200, 60, 50, 255}
	goalOf = color.RGBA{30, 30, 30, 255}
)

func chart(w io.Writer, r workloads.Report) error {
	var rows []workloads.Row
	for _, row := range r.Rows {
		if row.Measure.Goal != 0 {
			rows = append(rows, row)
		}
	}
	width := labelWidth + int(barWidth*maxShare) + 60
	height := top + rowHeight*len(rows) + 30
	img := image.NewRGBA(image.Rect(0, 0, width, height))
	draw.Draw(img, img.Bounds(), image.NewUniform(white), image.Point{}, draw.Src)
	text(img, 8, 16, black, fmt.Sprintf("What protection keeps of each workload (protected / unprotected; time rows inverted): %s, %s", r.Date, r.Commit))
	text(img, 8, 32, grey, r.Machine+"; "+r.Cores())
	x0 := labelWidth
	// The axis at shares 0, 0.5 and 1.
	for _, s := range []float64{0, 0.5, 1} {
		x := x0 + int(s*barWidth)
		fill(img, image.Rect(x, top-4, x+1, top+rowHeight*len(rows)), grey)
		text(img, x-8, top+rowHeight*len(rows)+16, black, fmt.Sprintf("%.1f", s))
	}
	for i, row := range rows {
		y := top + i*rowHeight
		text(img, 8, y+15, black, clip(row.Workload+": "+row.Measure.Name, 60))
		kept := min(row.Kept(), maxShare)
		c := green
		if !row.GoalMet() {
			c = red
		}
		fill(img, image.Rect(x0, y+4, x0+int(kept*barWidth), y+rowHeight-4), c)
		gx := x0 + int(min(keptGoal(row.Measure), maxShare)*barWidth)
		fill(img, image.Rect(gx-1, y+1, gx+2, y+rowHeight-1), goalOf)
		label := fmt.Sprintf("%.2f", row.Kept())
		if m := row.Measure; m.Limit != 0 && row.Protected > m.Limit {
			label += fmt.Sprintf(" (%.0f %s, over %.0f)", row.Protected, m.Unit, m.Limit)
		}
		text(img, x0+int(kept*barWidth)+6, y+15, black, label)
	}
	return png.Encode(w, img)
}

func fill(img *image.RGBA, r image.Rectangle, c color.Color) {
	draw.Draw(img, r, image.NewUniform(c), image.Point{}, draw.Src)
}

func text(img *image.RGBA, x, y int, c color.Color, s string) {
	d := font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}
