// Package bytesize prints byte counts the way kvindex's logs and help show
// them: "512MiB", "1.5GiB", and "unlimited" for 0, since every size kvindex
// logs is a limit or a budget whose zero means none.
package bytesize
